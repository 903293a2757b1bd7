/* The run page follows its run's event stream (GET /api/runs/{id}/events) while the run is live.
 *
 * An Event updates the status, the current step and the progress bar at once, from its data and
 * as text only, then asks for the page's polled partial again (at most every REFRESH_GAP_MS), so
 * that the server's rendering stays the one truth for the timeline and the controls. `model.text`
 * updates fill the Live output box while a model call runs; the step's end hides it.
 *
 * While the stream is open, the 2 s polls of #progress are held back (htmx:beforeRequest); the
 * re-fetches come from #run-stream and carry `via=stream`. Polling takes over again:
 *  - between a dropped connection and the browser's reconnect;
 *  - for good, when the stream did not open within OPEN_TIMEOUT_MS (of the start, or of a
 *    reconnect being due), when the browser gave up on it (an `error` with readyState CLOSED:
 *    a 204 for a finished run, an HTTP error, an answer that is not an event stream), or after
 *    MAX_ERRORS errors in a row without an open between them.
 * The stream is closed after the run's terminal Event.
 */
(function () {
  "use strict";

  const root = document.getElementById("run-stream");
  if (!root || typeof window.EventSource !== "function" || !window.htmx) {
    return; // polling as without JavaScript's extras
  }

  const OPEN_TIMEOUT_MS = 5000;
  const RECONNECT_MS = 2000; // the server's `retry:`; a reconnect is due this long after an error
  const MAX_ERRORS = 3;
  const REFRESH_GAP_MS = 300;
  const TERMINAL = ["run.done", "run.failed", "run.cancelled"];
  // EventSource delivers a named event only to listeners of its name.
  const TYPES = [
    "run.queued", "run.running", "run.waiting_human", "run.waiting", "run.paused", "run.resumed",
    "run.retried", "run.approved", "run.rejected", "run.resolved", "run.cancel_requested",
    "run.pause_requested", "run.done", "run.failed", "run.cancelled",
    "step.started", "step.done", "step.failed", "progress", "approval.requested", "message.received",
    "webhook.redelivered",
  ];

  const labels = JSON.parse(document.getElementById("run-status-labels").textContent);
  const stateNote = root.querySelector("[data-stream-state]");
  const output = root.querySelector("[data-live-output]");
  const outputText = root.querySelector("[data-live-output-text]");
  const outputCall = root.querySelector("[data-live-output-call]");

  let source = null;
  let openTimer = null;
  let errors = 0;
  let stopped = false; // closed for good: the run ended, or polling took over
  let finished = false; // the run's terminal Event came
  let refreshTimer = null;
  let refreshing = false;
  let again = false;
  let lastRefresh = 0;

  window.runStreamOpen = false;

  document.body.addEventListener("htmx:beforeRequest", function (event) {
    if (window.runStreamOpen && event.detail.elt && event.detail.elt.id === "progress") {
      event.preventDefault(); // a poll while the stream tells us everything
    }
  });

  function setOpen(open) {
    window.runStreamOpen = open;
    stateNote.hidden = !open;
  }

  function start() {
    source = new EventSource(root.dataset.streamUrl);
    source.addEventListener("open", onOpen);
    source.addEventListener("error", onError);
    TYPES.forEach(function (type) {
      source.addEventListener(type, onEvent);
    });
    source.addEventListener("model.text", onText);
    expectOpen(OPEN_TIMEOUT_MS);
  }

  function expectOpen(ms) {
    clearTimeout(openTimer);
    openTimer = setTimeout(fallBack, ms);
  }

  function onOpen() {
    if (stopped) return;
    clearTimeout(openTimer);
    errors = 0;
    setOpen(true);
  }

  function onError() {
    if (stopped) return;
    setOpen(false); // the polls cover the gap
    errors += 1;
    if (source.readyState === EventSource.CLOSED || errors >= MAX_ERRORS) {
      fallBack();
    } else {
      expectOpen(RECONNECT_MS + OPEN_TIMEOUT_MS);
    }
  }

  function stop() {
    stopped = true;
    clearTimeout(openTimer);
    source.close();
    hideOutput();
  }

  function fallBack() {
    if (stopped) return;
    stop();
    setOpen(false);
    refreshSoon(); // catch up now rather than at the next poll
  }

  function parse(message) {
    try {
      return JSON.parse(message.data);
    } catch (error) {
      return null;
    }
  }

  function onEvent(message) {
    if (stopped) return;
    const event = parse(message);
    if (event === null) return;
    show(message.type, event.data || {});
    if (TERMINAL.indexOf(message.type) !== -1) {
      finished = true;
      stop(); // the server closes it too; closing first spares the reconnect that would get a 204
    }
    refreshSoon();
  }

  function onText(message) {
    if (stopped) return;
    const update = parse(message);
    const data = update && update.data;
    if (!data || typeof data.text !== "string") return;
    outputCall.textContent = Number.isInteger(data.iteration) ? "· model call " + data.iteration : "";
    outputText.textContent = data.text;
    output.hidden = false;
    outputText.scrollTop = outputText.scrollHeight;
  }

  function hideOutput() {
    output.hidden = true;
    outputText.textContent = "";
    outputCall.textContent = "";
  }

  // What the event says, shown at once; the re-fetch that follows brings the rest.
  function show(type, data) {
    const section = document.getElementById("progress");
    if (!section) return;
    if (type.indexOf("step.") === 0 || type === "progress") {
      const name = type === "progress" ? data.current_step : data.name;
      if (typeof name === "string" && name !== "") {
        setText(section.querySelector('[data-live="current-step"] dd'), name);
        // Between steps the name is the last finished one (runs/dashboard/presenters.py now_step).
        const finished = type === "step.done" || type === "step.failed";
        setText(section.querySelector('[data-live="current-step"] dt'), finished ? "Last step" : "Current step");
      }
    }
    if (type.indexOf("run.") === 0) {
      const status = type.slice(4);
      if (Object.prototype.hasOwnProperty.call(labels, status)) showStatus(section, status);
    }
    if (Number.isInteger(data.steps_done)) showSteps(section, data.steps_done, data.steps_total);
    if (type === "step.done" || type === "step.failed") hideOutput();
  }

  function showStatus(section, status) {
    const badge = section.querySelector('[data-live="status"] .badge');
    if (badge) {
      badge.textContent = labels[status];
      badge.className = "badge badge-" + status;
    }
    const bar = section.querySelector("progress");
    if (bar) bar.className = "progress-" + status;
  }

  function showSteps(section, done, total) {
    const counted = Number.isInteger(total) && total > 0;
    setText(section.querySelector('[data-live="steps-done"] dd'),
            counted ? done + " of " + total : done + (done === 1 ? " step" : " steps"));
    const bar = section.querySelector("progress");
    if (bar && counted) {
      bar.max = total;
      bar.value = done;
      bar.textContent = Math.min(100, Math.round((100 * done) / total)) + "%";
    }
  }

  function setText(element, text) {
    if (element) element.textContent = text;
  }

  // The polled partial again, never more often than every REFRESH_GAP_MS, one at a time.
  function refreshSoon() {
    if (refreshTimer !== null) return; // one is due, and it will read the newest state
    if (refreshing) {
      again = true;
      return;
    }
    refreshTimer = setTimeout(refresh, Math.max(0, lastRefresh + REFRESH_GAP_MS - Date.now()));
  }

  function refresh() {
    refreshTimer = null;
    const section = document.getElementById("progress");
    const url = section && section.getAttribute("hx-get");
    if (!url) {
      done();
      return; // the page shows a finished run: nothing more to fetch
    }
    refreshing = true;
    lastRefresh = Date.now();
    const marked = url + (url.indexOf("?") === -1 ? "?" : "&") + "via=stream";
    htmx
      .ajax("GET", marked, { source: root, target: "#progress", swap: "outerHTML" })
      .catch(function () {
        // htmx reported it; the next Event, or polling, tries again
      })
      .then(function () {
        refreshing = false;
        if (again) {
          again = false;
          refreshSoon();
        } else {
          done();
        }
      });
  }

  function done() {
    if (finished) setOpen(false); // the last re-fetch is in: polls may go (a finished page has none)
  }

  start();
})();
