/* The article header's "contents" button opens the page's table of contents (site.css shows
   the button below 1600 px). pydata-sphinx-theme wires only the first .secondary-toggle of a
   page, the navbar's, which sphinx-book-theme hides: this one hands its click on to it. */
document.addEventListener("DOMContentLoaded", () => {
  const wired = document.querySelector(".secondary-toggle");
  document.querySelectorAll(".bd-header-article .secondary-toggle").forEach((button) => {
    if (wired && button !== wired)
      button.addEventListener("click", (event) => {
        event.preventDefault();
        wired.click();
      });
  });
});
