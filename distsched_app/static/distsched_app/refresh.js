/* distsched admin auto-refresh: a checkbox (#distsched-refresh) that reloads the page every
   data-seconds while it is checked. Off by default; remembered per page kind in localStorage.
   Reloading keeps the URL, so the filters, search and sort in the query string are kept.
   Paused while the tab is hidden (document.hidden), while a row is selected for an action,
   and while the operator types in a field. No dependency. */
(function () {
    "use strict";
    var box = document.getElementById("distsched-refresh");
    if (!box) { return; }
    var seconds = Math.max(parseInt(box.getAttribute("data-seconds"), 10) || 10, 2);
    var key = "distsched-refresh:" + (box.getAttribute("data-key") || "page");
    var timer = null;

    function remembered() {
        try { return window.localStorage.getItem(key) === "on"; } catch (e) { return false; }
    }
    function remember(on) {
        try { window.localStorage.setItem(key, on ? "on" : "off"); } catch (e) { /* private mode */ }
    }
    function busy() {
        var active = document.activeElement;
        if (active && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName) && active !== box) { return true; }
        return document.querySelector("input.action-select:checked, #action-toggle:checked") !== null;
    }
    function stop() {
        if (timer !== null) { window.clearTimeout(timer); timer = null; }
    }
    function schedule() {
        stop();
        if (!box.checked || document.hidden) { return; }
        timer = window.setTimeout(function () {
            timer = null;
            if (!box.checked || document.hidden) { return; }
            if (busy()) { schedule(); return; }
            window.location.reload();
        }, seconds * 1000);
    }
    box.checked = remembered();
    box.addEventListener("change", function () { remember(box.checked); schedule(); });
    document.addEventListener("visibilitychange", schedule);
    schedule();
}());
