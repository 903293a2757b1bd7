"""Template tags that show what agents wrote (see ``runs.dashboard.rendering``).

{% load rendering %}
{{ text|markdown }}
{% proposal_view waiting.proposal as proposal_view %}{% include "runs/_proposal.html" %}
{% answer_view run.result steps as answer %}{% if answer %}{% include "runs/_answer.html" %}{% endif %}
{% transcript step steps as transcript %}{% if transcript %}{% include "runs/_transcript.html" %}{% endif %}
"""

from __future__ import annotations

from django import template

from runs.dashboard import rendering, transcripts

register = template.Library()

register.filter("markdown", rendering.markdown_html)
register.simple_tag(rendering.proposal_view, name="proposal_view")
register.simple_tag(rendering.answer_view, name="answer_view")
register.simple_tag(transcripts.transcript, name="transcript")
