// Sign-in: an API token (what `netsleuth controller` issues) or, where the controller is configured for it,
// an OIDC ID token (implicit flow; the IdP sends it back in the URL fragment, and it is used as the Bearer).

import { ApiError, api, setToken } from "./api.js";
import { field, h } from "./dom.js";

/** On return from the identity provider the fragment is #id_token=...; keep it and clean the address bar. */
export function takeOidcToken() {
  const params = new URLSearchParams(location.hash.replace(/^#/, ""));
  const token = params.get("id_token");
  if (!token) return;
  setToken(token);
  history.replaceState(null, "", `${location.pathname}#/hosts`);
}

export function renderSignin(root, ctx, loadMe) {
  const input = h("input", { type: "password", name: "token", autocomplete: "current-password", required: true, spellcheck: "false" });
  const error = h("p", { class: "form-error", role: "alert", hidden: true });
  const submit = h("button", { type: "submit" }, "Sign in");
  const oidcSlot = h("div");
  const form = h(
    "form",
    { class: "panel signin", "aria-labelledby": "signin-title" },
    h("h1", { id: "signin-title" }, "Sign in to the fleet"),
    h("p", { class: "muted" }, "Use the API token your administrator gave you (the one `netsleuth fleet` reads from NETSLEUTH_TOKEN)."),
    field("API token", input, "or an OIDC ID token (JWT) from your identity provider, where the controller trusts one"),
    error,
    h("div", { class: "row" }, submit),
    oidcSlot,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.hidden = true;
    submit.disabled = true;
    setToken(input.value.trim());
    try {
      await loadMe();
      ctx.notify("");
      ctx.navigate("#/hosts");
    } catch (err) {
      setToken(null);
      error.textContent = err instanceof ApiError ? err.message : String(err);
      error.hidden = false;
      input.setAttribute("aria-invalid", "true");
      input.focus();
    } finally {
      submit.disabled = false;
    }
  });
  root.append(form);
  input.focus();
  offerOidc(oidcSlot);
}

async function offerOidc(slot) {
  let config;
  try {
    config = await api("/auth");
  } catch {
    return; // an older controller without /auth: the token field is all there is
  }
  const oidc = config && config.oidc;
  if (!oidc) return;
  // The controller validates ID tokens (JWKS) but is not an OIDC client itself: say whose tokens it takes,
  // and offer the identity provider's login only where one is configured.
  slot.append(h("p", { class: "muted small" }, `This controller accepts ID tokens from ${oidc.issuer}${oidc.audience ? ` for the audience ${oidc.audience}` : ""}.`));
  if (!oidc.authorize_url) return;
  const url = new URL(oidc.authorize_url);
  url.searchParams.set("response_type", "id_token");
  url.searchParams.set("client_id", oidc.client_id || oidc.audience || "");
  url.searchParams.set("scope", oidc.scope || "openid");
  url.searchParams.set("redirect_uri", `${location.origin}${location.pathname}`);
  url.searchParams.set("nonce", crypto.randomUUID());
  slot.append(h("a", { class: "button quiet", href: url.toString() }, "Sign in with your identity provider"));
}
