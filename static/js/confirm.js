/* Destructive buttons ask first: a button with data-confirm opens the page's <dialog id="confirm-dialog">
 * and submits its form (with confirmed=1) only when the person confirms.
 *
 * Without JavaScript the form posts without confirmed=1 and the server answers with a confirmation
 * page instead of acting, so nothing is destroyed by one click either way.
 */
(function () {
  "use strict";
  const dialog = document.getElementById("confirm-dialog");
  if (!dialog || typeof dialog.showModal !== "function") return;
  const title = dialog.querySelector("[data-confirm-title]");
  const text = dialog.querySelector("[data-confirm-text]");
  const yes = dialog.querySelector("[data-confirm-yes]");
  let pending = null;

  document.addEventListener("click", function (event) {
    const button = event.target.closest("button[data-confirm]");
    if (!button || !button.form) return;
    event.preventDefault();
    pending = button;
    title.textContent = button.dataset.confirmTitle || button.textContent.trim() + "?";
    text.textContent = button.dataset.confirm;
    yes.textContent = button.dataset.confirmLabel || button.textContent.trim();
    dialog.returnValue = "";
    dialog.showModal();
  });

  dialog.addEventListener("close", function () {
    const button = pending;
    pending = null;
    if (!button || dialog.returnValue !== "confirm") {
      if (button) button.focus();
      return;
    }
    const form = button.form;
    let confirmed = form.querySelector('input[name="confirmed"]');
    if (!confirmed) {
      confirmed = document.createElement("input");
      confirmed.type = "hidden";
      confirmed.name = "confirmed";
      form.appendChild(confirmed);
    }
    confirmed.value = "1";
    form.requestSubmit(button);
  });
})();
