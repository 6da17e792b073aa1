// Entry point: sign-in state, the role from GET /api/v1/me, and a hash router (#/hosts, #/new,
// #/session/<id>, #/history, #/audit). The page hides what the role does not allow; the server refuses it anyway.

import { ApiError, api, getToken, setToken } from "./api.js";
import { clear, h, put } from "./dom.js";
import { renderSignin, takeOidcToken } from "./signin.js";
import { renderHosts } from "./hosts.js";
import { renderNew } from "./newsession.js";
import { renderSession } from "./session.js";
import { renderHistory } from "./history.js";
import { renderAudit } from "./audit.js";

const view = document.getElementById("view");
const nav = document.getElementById("nav");
const who = document.getElementById("who");
const notice = document.getElementById("notice");

const ctx = {
  me: null,
  selectedHosts: new Set(), // carried from the hosts page to the new-diagnosis form
  navigate(hash) {
    if (location.hash === hash) route();
    else location.hash = hash;
  },
  notify(text, kind = "") {
    notice.textContent = text;
    notice.className = `notice ${kind}`;
    notice.hidden = !text;
  },
  async signedOut(sentence) {
    setToken(null);
    ctx.me = null;
    ctx.navigate("#/signin");
    if (sentence) ctx.notify(sentence, "bad");
  },
};

let cleanup = null;

const pages = {
  signin: () => renderSignin(view, ctx, loadMe),
  hosts: () => renderHosts(view, ctx),
  new: () => renderNew(view, ctx),
  session: (id) => renderSession(view, ctx, decodeURIComponent(id)),
  history: () => renderHistory(view, ctx),
  audit: () => renderAudit(view, ctx),
};

async function loadMe() {
  ctx.me = await api("/me");
  const roles = (ctx.me.roles || []).join(", ");
  put(document.getElementById("who-name"), 
    h("span", {}, "Signed in as ", h("strong", {}, ctx.me.user)),
    roles ? h("span", { class: "role" }, ` (${roles})`) : null,
  );
  who.hidden = false;
  nav.hidden = false;
  for (const link of nav.querySelectorAll("[data-admin]")) link.hidden = !ctx.me.admin;
  return ctx.me;
}

async function route() {
  if (cleanup) {
    try {
      cleanup();
    } catch {
      /* a page's teardown must never block navigation */
    }
    cleanup = null;
  }
  ctx.notify("");
  const [page = "hosts", arg] = location.hash.replace(/^#\/?/, "").split("/");
  if (!getToken() || !ctx.me) {
    if (getToken() && !ctx.me) {
      try {
        await loadMe();
      } catch (err) {
        return ctx.signedOut(err instanceof ApiError ? err.message : String(err));
      }
    } else {
      nav.hidden = true;
      who.hidden = true;
      clear(view);
      cleanup = pages.signin() || null;
      return;
    }
  }
  if (page === "signin") return ctx.navigate("#/hosts");
  const render = pages[page];
  for (const link of nav.querySelectorAll("a")) {
    if (link.dataset.page === page) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  clear(view);
  if (!render) {
    view.append(h("h1", {}, "Not found"), h("p", {}, "There is no page here. ", h("a", { href: "#/hosts" }, "Go to the hosts.")));
    return;
  }
  if (page === "audit" && !ctx.me.admin) {
    view.append(h("h1", {}, "Audit"), h("p", { class: "error" }, "Only administrators can read the audit."));
    return;
  }
  try {
    cleanup = (await render(arg)) || null;
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) return ctx.signedOut(err.message);
    view.append(h("p", { class: "form-error", role: "alert" }, err.message || String(err)));
  }
  view.focus({ preventScroll: true });
}

document.getElementById("signout").addEventListener("click", () => ctx.signedOut(""));
window.addEventListener("hashchange", route);
takeOidcToken();
route();
