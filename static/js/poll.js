/* The dashboard's polled partials (data-poll-visible, hx-trigger "every 2s, visibilitychange from:document")
 * ask for nothing while the tab is hidden, and once at once when it shows again.
 *
 * A listener rather than htmx's event filters ("every 2s [document.visibilityState === 'visible']"),
 * which htmx evaluates as code: the Content-Security-Policy allows no eval.
 */
(function () {
  "use strict";
  document.addEventListener("htmx:beforeRequest", function (event) {
    const elt = event.detail.elt;
    if (document.visibilityState !== "visible" && elt && elt.hasAttribute("data-poll-visible")) {
      event.preventDefault();
    }
  });
})();
