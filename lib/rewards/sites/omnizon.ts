// Omnizon (Amazon clone) milestones: search results → product page → add to cart → cart → checkout.
//
// Client-state evidence (REAL `/finish` JSON, the structure the v2 omnizon verifiers read):
//   - search: `initialfinaldiff.{updated,added}.filter.searchQuery` (submitted; `searchInputValue` is only
//     the text typed into the box, so it is not evidence of a search);
//   - page: `initialfinaldiff.updated.router.location.pathname` (`/confirmation` after an order);
//   - orders: `initialfinaldiff.{added,updated}.order.orders` (id → order with `items[]` of `id`, `price`,
//     `quantity`).
//   - cart: the verifiers never read it; a top-level slice whose name contains "cart" (as on the other REAL
//     shops) is read when present, unverified.
// A placed order proves items went into the cart and checkout ran (also via "Buy Now"), so add_to_cart
// and checkout_started fire with it.

import {
  changedSubtrees,
  defineDetector,
  describeNode,
  FIELD_ROLES,
  findNode,
  getPath,
  isEnabled,
  isRecord,
  itemsOf,
  MESSAGE_ROLES,
  meaningful,
  nonEmpty,
  oneLine,
  pathEvidence,
  queryEvidence,
  quote,
  routerPath,
  walk,
  type AxNode,
  type MilestoneDetector,
  type Page,
} from '../milestones';

function placedOrder(state: unknown): string | null {
  for (const { section, tree } of changedSubtrees(state)) {
    for (const order of itemsOf(getPath(tree, ['order', 'orders']))) {
      if (!isRecord(order)) continue;
      const items = itemsOf(order.items).filter(isRecord);
      if (items.length > 0) {
        const ids = items.slice(0, 5).map((i) => oneLine(String(i.id ?? '?'), 20));
        return `state: ${section}.order.orders has an order of ${items.length} item(s) (ids ${ids.join(', ')})`;
      }
    }
  }
  return null;
}

function statePath(p: Page, re: RegExp): string | null {
  const path = routerPath(p.state);
  return path && re.test(path) ? `state: router.location.pathname ${oneLine(path, 80)}` : null;
}

const SEARCH_PATH = /\/(search|s|results)(\/|$)/i;
const SEARCH_PARAM = /^(q|query|k|keywords?|search|searchquery|search_query|searchterm|term)$/i;
const RESULTS_TEXT = /\bresults?\s+for\b|^\d[\d,]*\s*(-\s*\d[\d,]*\s+of\s+(over\s+)?\d[\d,]*\s+)?results?\b|^search\s+results\b|^showing\s+\d/i;
const PRODUCT_PATH = /\/(product|products|item|items|dp|p)\/[^/]+/i;
const ADD_TO_CART = /^add\s+to\s+(cart|basket)$/i;
const BUY_NOW = /^buy\s+now$/i;
const QUANTITY = /^(qty|quantity)\b/i;
const ADDED_TOAST = /^(\d+\s+items?\s+)?added\s+to\s+(your\s+)?(cart|basket)\b/i;
const CART_PATH = /\/(cart|basket|shopping[-_]?cart|bag)(\/|$)/i;
const CART_HEADING = /^((your|my)\s+)?(shopping\s+)?(cart|basket|bag)$|^shopping\s+cart\b/i;
const CHECKOUT_PATH = /\/(checkout|payment|shipping|place[-_]?order|review[-_]?order|confirmation|order[-_]?confirmation|thank[-_]?you)(\/|$)/i;
const CHECKOUT_BUTTON = /^(place\s+(your\s+)?order|pay(\s+now)?|complete\s+(purchase|order)|confirm\s+(order|purchase))$/i;
const CHECKOUT_HEADING = /^(checkout|secure\s+checkout|review\s+your\s+order|shipping\s+address|payment\s+method|order\s+(placed|confirmed))\b/i;

/** The number of items a cart link/button shows ("Cart 2", "2 items in cart", "Cart (2)"), or null. */
function cartCount(p: Page): { node: AxNode; count: number } | null {
  for (const n of p.nodes) {
    if (n.role !== 'link' && n.role !== 'button' && n.role !== 'text') continue;
    const name = n.name.trim();
    const m = /^(?:\D{0,20}\s)?(\d{1,4})\s+items?\s+in\s+(?:your\s+)?cart\b/i.exec(name) ?? /\bcart\b\D{0,4}\(?(\d{1,4})\)?$/i.exec(name);
    if (m) return { node: n, count: Number(m[1]) };
  }
  return null;
}

/** A top-level "cart" slice of the state diff that holds an item (id, quantity or name). */
function cartState(state: unknown): string | null {
  for (const { section, tree } of changedSubtrees(state)) {
    for (const key of Object.keys(tree).slice(0, 200)) {
      if (!/cart/i.test(key)) continue;
      const hit = walk(getPath(tree, [key]), (e) =>
        /^(id|productid|product_id|quantity|qty|sku)$/i.test(e.key) && meaningful(e.value) ? `${e.path.join('.')} = ${quote(e.value)}` : null,
      );
      if (hit) return `state: ${section}.${key}.${hit}`;
    }
  }
  return null;
}

export const omnizonMilestones: MilestoneDetector[] = [
  // A results page: URL `/search`, `/s` or a search parameter (?q=, ?k=, ?searchQuery=...), or a line like
  // `1-16 of 200 results for "pot"`; state: a submitted `filter.searchQuery`. Text typed into the search
  // box but not submitted is not evidence.
  defineDetector('search_results', 'url /search or ?q=/?k=/?searchQuery=, or text "... results for"; state: filter.searchQuery set', (view) => {
    const url = pathEvidence(view, SEARCH_PATH) ?? queryEvidence(view, SEARCH_PARAM);
    if (url) return url;
    const text = findNode(view, (n) => MESSAGE_ROLES.has(n.role) && RESULTS_TEXT.test(n.name.trim()));
    if (text) return describeNode(text);
    for (const { section, tree } of changedSubtrees(view.state)) {
      const q = getPath(tree, ['filter', 'searchQuery']);
      if (typeof q === 'string' && nonEmpty(q)) return `state: ${section}.filter.searchQuery ${quote(q)}`;
    }
    return null;
  }),

  // A product detail page: URL `/product/<id>` (also /dp/, /item/, /p/), same in the router state, or an
  // "Add to Cart" button next to a Quantity control, or a "Buy Now" button.
  defineDetector('product_page', 'url /product/<id> (or router pathname), or "Add to Cart" with a Quantity control, or "Buy Now"', (view) => {
    const url = pathEvidence(view, PRODUCT_PATH) ?? statePath(view, PRODUCT_PATH);
    if (url) return url;
    const add = findNode(view, (n) => n.role === 'button' && ADD_TO_CART.test(n.name.trim()));
    const qty = findNode(view, (n) => (FIELD_ROLES.has(n.role) || n.role === 'button') && QUANTITY.test(n.name.trim()));
    if (add && qty) return `${describeNode(add)} with ${describeNode(qty)}`;
    const buy = findNode(view, (n) => n.role === 'button' && BUY_NOW.test(n.name.trim()));
    return buy ? describeNode(buy) : null;
  }),

  // A toast "Added to Cart", or the cart count on the cart link grew between the two pages; state: a cart
  // slice with an item, or a placed order. The "Add to Cart" button itself is not evidence.
  defineDetector('add_to_cart', 'toast "Added to Cart", or cart count grew; state: cart slice with an item, or a placed order', (view, prev) => {
    const toast = findNode(view, (n) => MESSAGE_ROLES.has(n.role) && ADDED_TOAST.test(n.name.trim()));
    if (toast) return describeNode(toast);
    const after = cartCount(view);
    const before = cartCount(prev);
    if (after && before && after.count > before.count) return `${describeNode(before.node)} → ${describeNode(after.node)}`;
    return cartState(view.state) ?? placedOrder(view.state);
  }),

  // The cart page: URL `/cart` (or router pathname), or a heading "Shopping Cart" / "Your Cart". The "Cart"
  // link in the header is not evidence.
  defineDetector('cart_page', 'url /cart (or router pathname), or heading "Shopping Cart"', (view) => {
    const url = pathEvidence(view, CART_PATH) ?? statePath(view, CART_PATH);
    if (url) return url;
    const h = findNode(view, (n) => n.role === 'heading' && CART_HEADING.test(n.name.trim()));
    return h ? describeNode(h) : null;
  }),

  // Checkout: URL `/checkout` (or later: /payment, /confirmation), same in the router state, a "Place your
  // order" button or a "Checkout" heading; state: a placed order. The cart's "Proceed to checkout" button
  // is not evidence.
  defineDetector('checkout_started', 'url /checkout|/confirmation (or router pathname), "Place your order" button, "Checkout" heading; state: a placed order', (view) => {
    const url = pathEvidence(view, CHECKOUT_PATH) ?? statePath(view, CHECKOUT_PATH);
    if (url) return url;
    const b = findNode(view, (n) => n.role === 'button' && CHECKOUT_BUTTON.test(n.name.trim()) && isEnabled(n));
    if (b) return describeNode(b);
    const h = findNode(view, (n) => n.role === 'heading' && CHECKOUT_HEADING.test(n.name.trim()));
    if (h) return describeNode(h);
    return placedOrder(view.state);
  }),
];
