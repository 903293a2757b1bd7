"""The overview's throughput chart as plain SVG geometry: stacked bars, a y axis of runs, an x axis of times.

The template only draws what this computes, so there is no JavaScript and
nothing to load; the numbers stay readable in the bars' tooltips and in
the panel's heading.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

LEFT, RIGHT, TOP, BOTTOM = 40, 20, 12, 40  # room for the tick labels and the axis titles
PLOT_WIDTH, PLOT_HEIGHT = 312, 100
BAR_GAP = 6
X_LABEL_EVERY = 3  # a time under every third bar (15 minutes)


def nice_ceiling(value: int) -> int:
    """The smallest 1, 2 or 5 times a power of ten that is at least ``value`` (and at least 1)."""
    scale = 1
    while True:
        for step in (1, 2, 5):
            if step * scale >= value:
                return step * scale
        scale *= 10


def bar_chart(done: list[int], failed: list[int], since: datetime, bucket: timedelta) -> dict:
    """Failed stacked on done per bucket, scaled to a round maximum, with the axes' ticks and labels."""
    top = nice_ceiling(max([d + f for d, f in zip(done, failed, strict=True)] + [1]))
    step = PLOT_WIDTH / len(done)
    base = TOP + PLOT_HEIGHT  # the x axis

    def y(count: int) -> float:
        return round(base - PLOT_HEIGHT * count / top, 1)

    bars = []
    for i, (d, f) in enumerate(zip(done, failed, strict=True)):
        bars.append(
            {
                "x": round(LEFT + i * step + BAR_GAP / 2, 1),
                "width": round(step - BAR_GAP, 1),
                "done": d,
                "failed": f,
                "start": since + i * bucket,
                "y_done": y(d),
                "h_done": round(base - y(d), 1),
                "y_failed": y(d + f),
                "h_failed": round(y(d) - y(d + f), 1),
            }
        )
    ticks = sorted({0, top // 2, top} if top % 2 == 0 else {0, top})
    y_ticks = [{"y": y(value), "label": value} for value in ticks]
    x_ticks = [
        {
            "x": round(LEFT + i * step, 1),
            "label": timezone.localtime(since + i * bucket).strftime("%H:%M"),
        }
        for i in range(0, len(done) + 1, X_LABEL_EVERY)
    ]
    return {
        "bars": bars,
        "y_ticks": y_ticks,
        "x_ticks": x_ticks,
        "width": LEFT + PLOT_WIDTH + RIGHT,
        "height": TOP + PLOT_HEIGHT + BOTTOM,
        "left": LEFT,
        "right": LEFT + PLOT_WIDTH,
        "top": TOP,
        "base": base,
        "x_title": f"finished at ({timezone.get_current_timezone_name()}), {int(bucket.total_seconds() // 60)} "
        f"minutes a bar",
        "y_title_x": 12,
        "y_title_y": TOP + PLOT_HEIGHT / 2,
        "x_title_x": LEFT + PLOT_WIDTH / 2,
        "x_title_y": base + 34,
    }
