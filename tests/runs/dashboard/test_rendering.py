"""What agents wrote, shown as people read it: sanitised Markdown with linked citations, proposals, transcripts."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest
from django.template import Context, Template
from django.template.loader import render_to_string

from examples.crm.models import Lead
from runs.control import post_message, reject_run
from runs.dashboard.rendering import (
    ALLOWED_TAGS,
    Source,
    answer_view,
    markdown_html,
    proposal_view,
)
from runs.dashboard.transcripts import transcript
from runs.models import Step
from runs.services import Actor, submit_run
from tests.support.fake_openai import MODEL, drive, say

pytest_plugins = ["tests.support.fake_openai"]  # the fake_llm and offline fixtures


class Elements(HTMLParser):
    """Every element of an HTML fragment with its attributes, and its text."""

    def __init__(self, html: str):
        super().__init__()
        self.elements: list[tuple[str, dict]] = []
        self.text = ""
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text += data


def assert_inert(html: str) -> Elements:
    """Only allowed tags; no event handler, style beyond alignment, or link to anything but http(s), mailto, #."""
    parsed = Elements(html)
    for tag, attrs in parsed.elements:
        assert tag in ALLOWED_TAGS, (tag, html)
        for name, value in attrs.items():
            assert not name.startswith("on"), (tag, name, html)
            assert name in {"href", "title", "rel", "class", "start"}, (tag, name, html)
            if name == "href":
                assert value.startswith(("http://", "https://", "mailto:", "#")), (value, html)
        if tag == "a" and "href" in attrs:
            assert attrs["rel"] == "nofollow noopener noreferrer", html
    return parsed


HOSTILE = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "[click](javascript:alert(1))",
    "[click](JaVaScRiPt:alert(1))",
    "[click](  javascript:alert(1))",
    "<javascript:alert(1)>",
    "[click](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    "[click](data:image/png;base64,iVBORw0KGgo=)",
    "[click](vbscript:msgbox(1))",
    "[click][evil]\n\n[evil]: javascript:alert(1)",
    "![pixel](https://tracker.example/p.png)",
    '<a href="javascript:alert(1)">raw link</a>',
    '<div><p onclick="steal()">nested <iframe src="https://evil.example"></iframe><svg onload=alert(1)></svg></p></div>',
    "<style>body{display:none}</style><form action=https://evil.example><input name=password></form>",
    "**bold <b onmouseover=alert(1)>html</b>**",
    "| a |\n|---|\n| <script>x</script> |",
    "```html\n<script>alert(1)</script>\n```",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_markdown_comes_out_as_inert_text(text):
    assert_inert(markdown_html(text))


def test_raw_html_is_shown_as_the_text_the_model_wrote():
    html = markdown_html(
        'Use <script>alert("x")</script> and <img src=x onerror=alert(1)> carefully'
    )
    assert (
        Elements(html).text.strip()
        == 'Use <script>alert("x")</script> and <img src=x onerror=alert(1)> carefully'
    )
    assert [tag for tag, _ in Elements(html).elements] == ["p"]


def test_markdown_keeps_what_an_answer_needs():
    html = markdown_html(
        "# Findings\n\n- **Leases** expire\n- `code` [docs](https://example.com/a?b=1) [mail](mailto:ops@example.com)"
        " [here](#step-3) [admin](/admin/)\n\n1. first\n\n> quoted\n\n| col |\n|--:|\n| 1 |"
    )
    parsed = assert_inert(html)
    tags = [tag for tag, _ in parsed.elements]
    for tag in ("h1", "ul", "li", "strong", "code", "ol", "blockquote", "table", "th", "td"):
        assert tag in tags, (tag, html)
    hrefs = [attrs.get("href") for tag, attrs in parsed.elements if tag == "a"]
    # A relative link to another page of the site is dropped; in-page anchors stay.
    assert hrefs == ["https://example.com/a?b=1", "mailto:ops@example.com", "#step-3", None]


def test_the_markdown_filter_renders_html_once_and_escapes_nothing_twice():
    out = Template("{% load rendering %}{{ text|markdown }}").render(
        Context({"text": "**a & b** <i>"})
    )
    assert out.strip() == "<p><strong>a &amp; b</strong> &lt;i&gt;</p>"


SOURCES = {
    "checkpoints-and-replay": Source("checkpoints-and-replay", 'Checkpoints & "replay"', seq=5),
    "idempotency-keys": Source("idempotency-keys", "Idempotency keys"),
}


def test_citations_of_known_sources_link_to_them_and_unknown_ids_stay_text():
    html = markdown_html(
        "Replay is free [checkpoints-and-replay]. Keys [idempotency-keys; checkpoints-and-replay] help. "
        "Made up [no-such-doc]. Code `[idempotency-keys]` and [a link [idempotency-keys]](https://example.com).",
        SOURCES,
    )
    parsed = assert_inert(html)
    links = [
        (attrs.get("href"), attrs.get("title"), attrs.get("class"))
        for tag, attrs in parsed.elements
        if tag == "a"
    ]
    assert links == [
        ("#step-5", 'Checkpoints & "replay"', "citation"),
        ("#source-idempotency-keys", "Idempotency keys", "citation"),
        ("#step-5", 'Checkpoints & "replay"', "citation"),
        ("https://example.com", None, None),  # no link inside a link
    ]
    assert "[no-such-doc]" in parsed.text and "<code>[idempotency-keys]</code>" in html
    assert "[idempotency-keys; checkpoints-and-replay]" in parsed.text


def test_a_citation_title_cannot_break_out_of_its_attribute():
    html = markdown_html("See [doc].", {"doc": Source("doc", '"><script>alert(1)</script>', seq=2)})
    parsed = assert_inert(html)
    assert [attrs["title"] for tag, attrs in parsed.elements if tag == "a"] == [
        '"><script>alert(1)</script>'
    ]


# Proposals


def test_a_proposal_shows_its_sentence_and_a_before_after_table():
    view = proposal_view(
        {
            "summary": "Update lead Ana Lopez (Acme)",
            "target": "Lead 1 (ana@acme.test)",
            "changes": [
                {"field": "stage", "before": "new", "after": "qualified"},
                {"field": "follow_up", "after": "2026-01-05"},
            ],
            "tool": "update_lead",
            "arguments": {"lead_id": 1, "stage": "qualified"},
            "note": "They confirmed budget.",
        }
    )
    assert (view.summary, view.target, view.note, view.has_before) == (
        "Update lead Ana Lopez (Acme)",
        "Lead 1 (ana@acme.test)",
        "They confirmed budget.",
        True,
    )
    assert [(r.field, r.before_known, r.before, r.after) for r in view.rows] == [
        ("Stage", True, "new", "qualified"),
        ("Follow up", False, "", "2026-01-05"),
    ]
    assert [(d.field, d.after) for d in view.details] == [
        ("Tool", "update_lead"),
        ("Arguments", '{\n  "lead_id": 1,\n  "stage": "qualified"\n}'),
    ]
    html = render_to_string("runs/_proposal.html", {"proposal_view": view})
    assert "Update lead Ana Lopez (Acme)" in html and '<th scope="col">Before</th>' in html
    assert 'class="before">new</td>' in html and "not read" in html


@pytest.mark.parametrize(
    ("proposal", "summary", "rows", "json_text"),
    [
        # A tool-call proposal recorded before proposals had a summary.
        (
            {"tool": "send", "arguments": {"to": "ana@example.com"}, "note": "ok"},
            "Call send",
            [("To", "ana@example.com")],
            "",
        ),
        (
            {"amount": 42, "to": "ACME", "paid": False, "memo": None},
            "",
            [("Amount", "42"), ("To", "ACME"), ("Paid", "no"), ("Memo", "—")],
            "",
        ),
        ({"fields": {"stage": "won"}}, "", [("Fields", '{\n  "stage": "won"\n}')], ""),
        ("Send the weekly report to the board", "Send the weekly report to the board", [], ""),
        ([1, 2], "", [], "[\n  1,\n  2\n]"),
        (None, "", [], "null"),
        ({}, "", [], "{}"),
    ],
)
def test_any_other_proposal_falls_back_to_rows_or_json(proposal, summary, rows, json_text):
    view = proposal_view(proposal)
    assert (view.summary, [(r.field, r.after) for r in view.rows], view.json_text) == (
        summary,
        rows,
        json_text,
    )
    assert not view.has_before


def test_html_in_a_proposal_is_escaped_on_the_card():
    view = proposal_view(
        {
            "summary": "<script>alert(1)</script>",
            "target": "<b>t</b>",
            "changes": [
                {"field": "<img src=x onerror=1>", "before": "<i>", "after": "</td><script>"}
            ],
        }
    )
    html = render_to_string("runs/_proposal.html", {"proposal_view": view})
    assert "<script" not in html and "<img" not in html and "<b>" not in html and "<i>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "&lt;/td&gt;&lt;script&gt;" in html


# Transcripts of real model calls


@pytest.mark.django_db(transaction=True)
def test_each_model_call_shows_as_a_transcript_of_what_it_added(tenant, fake_llm):
    fake_llm.enqueue(
        say("Let me count.", ("tick", {"i": 1}), ("tick", {"i": 2}), usage=(120, 30)),
        say("Two ticks.", usage=(200, 10)),
    )
    run = submit_run(tenant=tenant, kind="llm_agent", input={"prompt": "count twice"})
    post_message(run=run, actor=Actor(type="user", id="7"), text="Also say hi.")
    [run] = drive(run)
    assert run.status == "done", run.error
    steps = list(Step.objects.filter(run=run).order_by("seq"))
    first, second = [s for s in steps if s.kind == "llm"]
    assert transcript(steps[0], steps) is None  # "Starting the agent" is not a model call

    one = transcript(first, steps)
    assert [(e.role, e.label, e.text) for e in one.entries] == [
        ("system", "System prompt", "You are a test agent."),
        ("user", "User", "count twice"),
        ("assistant", "Model", "Let me count."),
    ]
    assert [(c.name, json.loads(c.arguments)) for c in one.entries[-1].calls] == [
        ("tick", {"i": 1}),
        ("tick", {"i": 2}),
    ]
    assert (one.model, one.tokens_in, one.tokens_out, one.earlier) == (MODEL, 120, 30, 0)
    assert one.cost_cents == first.cost_cents > 0

    two = transcript(second, steps, {"user:7": "Ana Lopez"})  # people's names, from runs.actors
    ticks = [s.seq for s in steps if s.name == "Calling tick"]
    assert [(e.role, e.label, e.text, e.seq) for e in two.entries] == [
        ("tool", "Result of tick", '{\n  "tick": 1\n}', ticks[0]),
        ("tool", "Result of tick", '{\n  "tick": 2\n}', ticks[1]),
        ("user", "Message from Ana Lopez", "Also say hi.", two.entries[2].seq),
        ("assistant", "Model", "Two ticks.", second.seq),
    ]
    # It was sent the whole conversation again; the first three messages show with the first call.
    assert (two.sent, two.earlier, two.tokens_in, two.tokens_out) == (6, 3, 200, 10)

    html = render_to_string("runs/_transcript.html", {"transcript": two})
    assert "Result of tick" in html and "Two ticks." in html and f'href="#step-{ticks[0]}"' in html
    assert (
        "3 earlier messages sent again" in html
    )  # (its tokens and cost are on the step's own line)


@pytest.mark.django_db(transaction=True)
def test_a_transcript_shows_rejected_calls_and_tool_errors(tenant, fake_llm):
    fake_llm.enqueue(
        say("Trying.", ("tick", '{"i": '), ("broken", {"reason": "disk full"})), say("Gave up.")
    )
    run = submit_run(tenant=tenant, kind="llm_agent", input={})
    [run] = drive(run)
    steps = list(Step.objects.filter(run=run).order_by("seq"))
    second = [s for s in steps if s.kind == "llm"][1]
    bad_json, raised, answer = transcript(second, steps).entries
    assert (bad_json.label, bad_json.error) == ("Result of tick", True)
    assert bad_json.text.startswith("Error: the arguments of tick are not valid JSON")
    assert (raised.label, raised.text, raised.error) == (
        "Result of broken",
        "Error: disk full",
        True,
    )
    assert answer.text == "Gave up."
    # What the malformed call sent is in its step.
    assert (
        Step.objects.get(run=run, name="Rejecting a call to tick").input["kwargs"]["call"][
            "arguments"
        ]
        == '{"i": '
    )


@pytest.mark.django_db(transaction=True)
def test_a_transcript_shows_a_call_a_person_rejected(tenant, offline):
    lead = Lead.objects.create(
        tenant=tenant, name="Ana Lopez", company="Acme", email="ana@acme.test", stage="new"
    )
    run = submit_run(
        tenant=tenant, kind="crm_update", input={"lead_id": lead.pk, "instruction": "They qualify"}
    )
    [run] = drive(run)
    reject_run(run=run, actor=Actor(type="user", id="42"), comment="wait for the budget")
    [run] = drive(run)
    assert run.status == "done", run.error
    steps = list(Step.objects.filter(run=run).order_by("seq"))
    last = [s for s in steps if s.kind == "llm"][-1]
    rejected, answer = transcript(last, steps).entries
    assert (rejected.role, rejected.label, rejected.error) == (
        "tool",
        "Result of update_lead",
        True,
    )
    # As the loop told the model, with the name recorded when they decided (user 42 does not exist).
    assert (
        rejected.text == "A deleted user rejected this call: wait for the budget. Do not retry it."
    )
    assert rejected.seq == Step.objects.get(run=run, kind="approval").seq
    assert "wait for the budget" in answer.text


@pytest.mark.django_db(transaction=True)
def test_a_transcript_through_the_template_tag_inside_a_timeline(tenant, fake_llm):
    fake_llm.enqueue(say("<script>alert(1)</script>"))
    run = submit_run(
        tenant=tenant, kind="llm_agent", input={"prompt": "<img src=x onerror=alert(1)>"}
    )
    [run] = drive(run)
    steps = list(Step.objects.filter(run=run).order_by("seq"))
    template = Template(
        "{% load rendering %}{% for step in steps %}{% transcript step steps as transcript %}"
        "{% if transcript %}{% include 'runs/_transcript.html' %}{% endif %}{% endfor %}"
    )
    html = template.render(Context({"steps": steps}))
    assert html.count('data-testid="transcript"') == 1
    assert (
        "&lt;script&gt;alert(1)&lt;/script&gt;" in html
        and "&lt;img src=x onerror=alert(1)&gt;" in html
    )
    assert "<script" not in html and "<img" not in html


# Answers

QUESTION = "How does a worker avoid running a step twice after a crash?"


@pytest.mark.django_db(transaction=True)
def test_a_research_answer_renders_with_citations_linked_to_the_steps_that_read_them(
    tenant, offline
):
    run = submit_run(tenant=tenant, kind="research", input={"question": QUESTION, "max_sources": 2})
    [run] = drive(run)
    assert run.status == "done", run.error
    steps = list(Step.objects.filter(run=run).order_by("seq"))
    reads = {
        s.input["kwargs"]["call"]["arguments"]["doc_id"]: s.seq
        for s in steps
        if s.name == "Calling read_doc"
    }
    view = answer_view(run.result, steps)
    assert view.kind == "answer" and view.title == QUESTION
    assert "\\n" not in view.html and "<li>" in view.html  # the answer's list, not a JSON string
    parsed = assert_inert(view.html)
    cited = [(a["href"], a["title"]) for tag, a in parsed.elements if tag == "a"]
    titles = {c["doc_id"]: c["title"] for c in run.result["citations"]}
    assert (
        cited
        and cited == [(f"#step-{reads[doc_id]}", titles[doc_id]) for doc_id in titles][: len(cited)]
    )
    assert [(s.doc_id, s.title, s.seq) for s in view.sources] == [
        (d, titles[d], reads[d]) for d in titles
    ]

    html = render_to_string("runs/_answer.html", {"answer": view})
    for doc_id, seq in reads.items():
        if doc_id in titles:
            assert f'<li id="source-{doc_id}"><a href="#step-{seq}">{titles[doc_id]}</a>' in html


@pytest.mark.django_db(transaction=True)
def test_a_hostile_model_answer_is_inert_on_the_page(tenant, fake_llm):
    answer = (
        'Done <script>document.cookie</script> <img src=x onerror="fetch(1)"> '
        "[win](javascript:alert(1)) [d](data:text/html,<b>x</b>) [leases-and-heartbeats] [made-up-doc]"
    )
    fake_llm.enqueue(say(answer))
    run = submit_run(tenant=tenant, kind="research", input={"question": QUESTION})
    [run] = drive(run)
    assert run.status == "done", run.error
    view = answer_view(run.result, list(Step.objects.filter(run=run)))
    parsed = assert_inert(view.html)
    assert [tag for tag, _ in parsed.elements] == ["p", "a"]  # only the known citation is a link
    assert "<script>document.cookie</script>" in parsed.text and "[made-up-doc]" in parsed.text
    assert "[win](javascript:alert(1))" in parsed.text
    html = render_to_string("runs/_answer.html", {"answer": view})
    assert "<script" not in html and "<img" not in html


@pytest.mark.django_db(transaction=True)
def test_a_research_brief_shows_its_fields_readably(tenant, offline):
    run = submit_run(
        tenant=tenant, kind="research_brief", input={"topic": "Acme Robotics", "depth": 2}
    )
    [run] = drive(run)
    assert run.status == "done", run.error
    view = answer_view(run.result, [])
    assert (view.kind, view.title) == ("brief", "Acme Robotics")
    assert Elements(view.html).text.strip() == run.result["brief"]
    assert dict(view.lists) == {
        "Questions": run.result["questions"],
        "Sources searched": run.result["sources"],
    }
    html = render_to_string("runs/_answer.html", {"answer": view})
    assert "<li>What does Acme Robotics do?</li>" in html and "Concise; sources cited." in html


def test_a_report_of_child_answers_links_citations_to_its_sources_list():
    child = "0b7c5f3e-8d3a-4c1e-9a55-2f1f6f8f6a11"
    view = answer_view(
        {
            "summary": "1 of 2 questions answered from 1 sources.",
            "sections": [
                {
                    "question": "How are retries delayed?",
                    "answer": "With backoff [retries-and-backoff].",
                    "run_id": child,
                }
            ],
            "sources": [{"doc_id": "retries-and-backoff", "title": "Retries and backoff"}],
            "unanswered": [{"question": "Why?", "status": "failed"}],
        }
    )
    assert (view.kind, view.title) == ("report", "1 of 2 questions answered from 1 sources.")
    [section] = view.sections
    assert section.heading == "How are retries delayed?" and section.run_url == f"/runs/{child}/"
    assert 'href="#source-retries-and-backoff"' in section.html
    assert view.lists == [("Not answered", ["Why? (failed)"])]
    html = render_to_string("runs/_answer.html", {"answer": view})
    assert '<li id="source-retries-and-backoff">Retries and backoff' in html


@pytest.mark.parametrize(
    "result",
    [
        None,
        {"lead_id": 1, "applied": True},
        [1, 2],
        "text",
        {"answer": 3},
        # The tutorial's write_post: sections that are strings are data, not a report.
        {"published": True, "sections": ["What durable runs is: 120 words, published"]},
    ],
)
def test_a_result_without_prose_has_no_answer_view(result):
    assert answer_view(result) is None
