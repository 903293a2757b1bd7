/* A thread's page (templates/runs/threads_detail.html): its composer, and the conversation kept live.
 *
 * The composer
 *  - says what the message will do: the server writes both sentences (with and without a mention)
 *    on #composer-hint, and the "Mention the agent" box picks one; a hint swapped in later (the
 *    thread woke, fell asleep, closed) is applied the same way, and a closed thread disables it;
 *  - posts through htmx; a refusal (409: the thread's policy, a closed thread, a spent budget),
 *    a form error (422) or a full queue (429) comes back as the composer with the reason, and is
 *    swapped in like a success rather than dropped as an error;
 *  - sends with Ctrl+Enter (or Cmd+Enter), and keeps the focus in its text box after sending.
 *
 * The conversation follows the thread's event stream (GET /api/threads/{id}/events, every turn's
 * Events in order) when the page has one (#thread-stream: an ASGI server answered it). After an
 * Event it asks for the conversation again (#conversation, with the thread's facts, state and
 * composer sentence out of band), at most every REFRESH_GAP_MS, so the server's rendering stays
 * the one truth. A dropped connection is resumed by the browser itself, with the Last-Event-ID
 * of the last Event it had. While the stream is open, the 2 s polls of #conversation (a live
 * turn, no stream) are held back; they take over for good when the stream did not open within
 * OPEN_TIMEOUT_MS, the browser gave up on it, or after MAX_ERRORS errors in a row. The stream is
 * closed after thread.closed (the server ends it there too).
 *
 * Across refreshes, the disclosures a person opened (a turn's steps) stay open, and a page
 * scrolled down to the composer stays there as replies arrive.
 */
(function () {
  "use strict";

  // The composer's sentence.

  function applyHint() {
    const hint = document.getElementById("composer-hint");
    const box = document.querySelector("[data-composer-mention]");
    if (!hint || !box) return;
    const text = box.checked ? hint.dataset.mention : hint.dataset.silent;
    if (typeof text === "string" && hint.textContent !== text) hint.textContent = text;
    const fields = box.closest("fieldset");
    if (fields && hint.dataset.closed === "1") fields.disabled = true;
  }

  document.addEventListener("change", function (event) {
    if (event.target.matches && event.target.matches("[data-composer-mention]")) applyHint();
  });

  document.addEventListener("keydown", function (event) {
    if (event.key !== "Enter" || !(event.ctrlKey || event.metaKey)) return;
    const form = event.target.closest && event.target.closest("form[data-composer]");
    if (!form) return;
    event.preventDefault();
    form.requestSubmit();
  });

  // A refused or invalid message comes back as the composer with the reason: swap it in.
  const COMPOSER_ANSWERS = [409, 422, 429];
  document.addEventListener("htmx:beforeSwap", function (event) {
    const elt = event.detail.requestConfig && event.detail.requestConfig.elt;
    if (!elt || !elt.closest || !elt.closest("form[data-composer]")) return;
    if (COMPOSER_ANSWERS.indexOf(event.detail.xhr.status) !== -1) {
      event.detail.shouldSwap = true;
      event.detail.isError = false;
    }
  });

  // Disclosures stay open, and the composer stays in view, across refreshes.

  const opened = new Set();
  document.addEventListener(
    "toggle",
    function (event) {
      const details = event.target;
      if (!(details instanceof HTMLDetailsElement) || !details.id) return;
      if (details.open) opened.add(details.id);
      else if (document.contains(details)) opened.delete(details.id);
    },
    true
  );

  let composerInView = false;

  function noteComposer(target) {
    if (!target || target.id !== "conversation") return;
    const composer = document.getElementById("composer");
    composerInView = !!composer && composer.getBoundingClientRect().top < window.innerHeight;
  }

  function afterSwap(target) {
    if (target && target.id === "composer") {
      // The composer came back from its own post: the next message is typed where the last one was.
      const text = document.getElementById("composer-text");
      if (text && !text.disabled) text.focus({ preventScroll: true });
    }
    opened.forEach(function (id) {
      const details = document.getElementById(id);
      if (details instanceof HTMLDetailsElement && !details.open) details.open = true;
    });
    applyHint();
    if (target && target.id === "conversation" && composerInView) {
      const composer = document.getElementById("composer");
      if (composer && composer.getBoundingClientRect().bottom > window.innerHeight) {
        composer.scrollIntoView({ block: "end" });
      }
    }
  }

  document.addEventListener("htmx:beforeSwap", function (event) {
    noteComposer(event.detail.target);
  });
  document.addEventListener("htmx:oobBeforeSwap", function (event) {
    noteComposer(event.detail.target);
  });
  document.addEventListener("htmx:afterSwap", function (event) {
    afterSwap(event.detail.target);
  });
  document.addEventListener("htmx:oobAfterSwap", function (event) {
    afterSwap(event.detail.target);
  });

  applyHint();

  // The thread's event stream.

  const root = document.getElementById("thread-stream");
  if (!root || typeof window.EventSource !== "function" || !window.htmx) {
    return; // the conversation polls while a turn is live, as without JavaScript
  }

  const OPEN_TIMEOUT_MS = 5000;
  const RECONNECT_MS = 2000; // the server's `retry:`
  const MAX_ERRORS = 3;
  const REFRESH_GAP_MS = 300;
  // EventSource delivers a named event only to listeners of its name.
  const TYPES = [
    "run.queued", "run.running", "run.waiting_human", "run.waiting", "run.paused", "run.resumed",
    "run.retried", "run.approved", "run.rejected", "run.resolved", "run.cancel_requested",
    "run.pause_requested", "run.done", "run.failed", "run.cancelled",
    "step.started", "step.done", "step.failed", "approval.requested", "message.received",
    "thread.reply", "thread.asleep", "thread.closed",
  ];

  const stateNote = root.querySelector("[data-stream-state]");
  let source = null;
  let openTimer = null;
  let errors = 0;
  let open = false;
  let stopped = false;
  let refreshTimer = null;
  let refreshing = false;
  let again = false;
  let lastRefresh = 0;

  document.body.addEventListener("htmx:beforeRequest", function (event) {
    if (open && event.detail.elt && event.detail.elt.id === "conversation") {
      event.preventDefault(); // a poll while the stream tells us everything
    }
  });

  function setOpen(value) {
    open = value;
    stateNote.hidden = !value;
  }

  function expectOpen(ms) {
    clearTimeout(openTimer);
    openTimer = setTimeout(fallBack, ms);
  }

  function start() {
    source = new EventSource(root.dataset.streamUrl);
    source.addEventListener("open", function () {
      if (stopped) return;
      clearTimeout(openTimer);
      errors = 0;
      setOpen(true);
    });
    source.addEventListener("error", function () {
      if (stopped) return;
      setOpen(false); // the polls cover the gap
      errors += 1;
      if (source.readyState === EventSource.CLOSED || errors >= MAX_ERRORS) {
        fallBack();
      } else {
        expectOpen(RECONNECT_MS + OPEN_TIMEOUT_MS);
      }
    });
    TYPES.forEach(function (type) {
      source.addEventListener(type, onEvent);
    });
    expectOpen(OPEN_TIMEOUT_MS);
  }

  function stop() {
    stopped = true;
    clearTimeout(openTimer);
    source.close();
  }

  function fallBack() {
    if (stopped) return;
    stop();
    setOpen(false);
    refreshSoon(); // catch up now rather than at the next poll
  }

  function onEvent(message) {
    if (stopped) return;
    if (message.type === "thread.closed") {
      stop(); // the thread takes no more turns: nothing more will come
      setOpen(false);
    }
    refreshSoon();
  }

  // The conversation again, never more often than every REFRESH_GAP_MS, one request at a time.
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
    if (!document.getElementById("conversation")) return;
    refreshing = true;
    lastRefresh = Date.now();
    htmx
      .ajax("GET", root.dataset.refreshUrl, { source: root, target: "#conversation", swap: "outerHTML" })
      .catch(function () {
        // htmx reported it; the next Event tries again
      })
      .then(function () {
        refreshing = false;
        if (again) {
          again = false;
          refreshSoon();
        }
      });
  }

  start();
})();
