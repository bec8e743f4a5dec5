import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse as parseYaml } from 'yaml';
import { ConfigError } from '../../lib/config/config';
import {
  computeReward,
  defaultRewardWeights,
  fnv1a32,
  initialRewardState,
  MAX_VISITED,
  milestonesFor,
  parseAxLine,
  parseAxtree,
  parseRewardWeights,
  rewardWeightsSchema,
  SITE_MILESTONES,
  stateKey,
  summarizeBreakdown,
  type RewardInput,
  type RewardState,
  type RewardView,
  type RewardWeights,
} from '../../lib/rewards';
import { loadRewardWeights } from '../../host/rewards-file';

const ROOT = join(__dirname, '..', '..');
const W = defaultRewardWeights();

function view(url: string, lines: string[], clientState?: unknown): RewardView {
  return clientState === undefined ? { url, axtree: lines.join('\n') } : { url, axtree: lines.join('\n'), clientState };
}

/** Evidence of `site.name` in `v` (after an action taken in `prev`). */
function detect(site: string, name: string, v: RewardView, prev: RewardView = BLANK): string | null {
  const d = milestonesFor(site).find((x) => x.name === name);
  assert.ok(d, `no detector ${site}.${name}`);
  return d.detect(v, prev);
}

function fires(site: string, name: string, v: RewardView, prev?: RewardView): string {
  const ev = detect(site, name, v, prev);
  assert.ok(ev !== null, `${site}.${name} should fire on ${JSON.stringify(v).slice(0, 300)}`);
  assert.equal(typeof ev, 'string');
  assert.ok(!ev.includes('\n') && ev.length <= 200, `evidence is one short line: ${ev}`);
  return ev;
}

function silent(site: string, name: string, v: RewardView, prev?: RewardView): void {
  const ev = detect(site, name, v, prev);
  assert.equal(ev, null, `${site}.${name} should not fire on ${JSON.stringify(v).slice(0, 300)}`);
}

const BLANK: RewardView = { url: 'https://example.test/', axtree: '' };

function step(over: Partial<RewardInput> & { before: RewardView; after: RewardView }): RewardInput {
  return { site: null, valid: true, actionKey: '{"type":"click","x":1,"y":2}', taskSuccess: null, envReward: 0, ...over };
}

function termNames(b: { terms: Array<{ term: string }> }): string[] {
  return b.terms.map((t) => t.term);
}

// ---------------------------------------------------------------------------------------------------------
// Accessibility-tree parser

test('parseAxLine reads id, role, name, value, extras and position', () => {
  const n = parseAxLine('[12] textbox "Subject \\"Q3\\"" value="Hello world" focused @(512,300)');
  assert.ok(n);
  assert.equal(n.id, 12);
  assert.equal(n.role, 'textbox');
  assert.equal(n.name, 'Subject "Q3"');
  assert.equal(n.value, 'Hello world');
  assert.deepEqual(n.flags, ['focused']);
  assert.equal(n.x, 512);
  assert.equal(n.y, 300);
  const sel = parseAxLine('[3] combobox "Sort" value="Price" options="Price | Beds" @(1,2)');
  assert.equal(sel?.props.options, 'Price | Beds');
  const bare = parseAxLine('[4] textbox value="" @(5,6)');
  assert.equal(bare?.name, '');
  assert.equal(bare?.value, '');
  assert.deepEqual(parseAxLine('[7] checkbox "All day" unchecked disabled @(1,1)')?.flags, ['unchecked', 'disabled']);
  assert.equal(parseAxLine("[8] button 'Send'")?.name, 'Send', 'single quotes and no position are accepted too');
  assert.equal(parseAxLine('… 12 more elements not shown'), null);
  assert.equal(parseAxLine(''), null);
  assert.equal(parseAxtree('[1] button "OK" @(1,1)\n\nnoise\n[2] link "Home" @(2,2)').length, 2);
});

// ---------------------------------------------------------------------------------------------------------
// GoMail

const MAIL = 'https://real-gomail.example.app/';
const INBOX = [
  '[1] button "Compose" @(60,120)',
  '[2] link "Inbox 12" @(60,200)',
  '[3] link "Sent" @(60,230)',
  '[4] textbox "Search mail" value="carol" @(400,40)',
  '[5] link "Amazon: Your message was sent to the seller" @(500,300)',
  '[6] button "Send feedback" @(900,700)',
  '[7] text "Conversation moved to Trash." @(100,690)',
];
const COMPOSE = (to: string, subject: string, sendExtra = '') => [
  ...INBOX,
  '[20] dialog "New Message" @(800,400)',
  `[21] combobox "To recipients" value=${JSON.stringify(to)} @(800,450)`,
  `[22] textbox "Subject" value=${JSON.stringify(subject)} @(800,480)`,
  '[23] textbox "Message Body" @(800,550)',
  `[24] button "Send"${sendExtra} @(720,680)`,
];
const SENT_EMAIL = { id: 101, from: 'me@gomail.com', to: ['carol@example.com'], subject: 'Meeting time change', content: '<p>Now at 8:30 AM</p>', sent: true, draft: false };

test('gomail: each milestone fires on its evidence', () => {
  fires('gomail', 'compose_opened', view(MAIL, COMPOSE('', '')));
  // No dialog title: a To field next to a Send button is a compose window too.
  fires('gomail', 'compose_opened', view(MAIL, [...INBOX, '[30] textbox "To" value="" @(1,1)', '[31] button "Send" @(2,2)']));
  fires('gomail', 'compose_opened', view(MAIL + '?compose=new', INBOX));
  fires('gomail', 'recipient_filled', view(MAIL, COMPOSE('carol@example.com', '')));
  fires('gomail', 'subject_filled', view(MAIL, COMPOSE('', 'Meeting time change')));
  fires('gomail', 'send_visible', view(MAIL, COMPOSE('', '')));
  fires('gomail', 'sent_confirmation', view(MAIL, INBOX, { differences: { emails: { added: [SENT_EMAIL], updated: [], deleted: [] } } }));
  fires('gomail', 'sent_confirmation', view(MAIL, INBOX, { initialfinaldiff: { added: { email: { emails: { '101': SENT_EMAIL } } }, updated: {} } }));
  // A reply sent inside an existing thread.
  fires('gomail', 'sent_confirmation', view(MAIL, INBOX, { initialfinaldiff: { added: { email: { emails: { '7': { replies: [{ ...SENT_EMAIL, isReply: true }] } } } } } }));
  fires('gomail', 'sent_confirmation', view(MAIL, INBOX, { initialfinaldiff: { updated: { ui: { snackbar: { message: 'Message sent' } } } } }));
  fires('gomail', 'sent_confirmation', view(MAIL, [...INBOX, '[40] alert "Message sent. Undo" @(100,690)']));
});

test('gomail: look-alikes do not fire', () => {
  // The inbox has a Compose button, a Search field with text, a "Sent" folder, "Send feedback", a row that
  // mentions a sent message and a trash toast: none of them is evidence.
  for (const name of ['compose_opened', 'recipient_filled', 'subject_filled', 'send_visible', 'sent_confirmation']) {
    silent('gomail', name, view(MAIL, INBOX));
  }
  silent('gomail', 'recipient_filled', view(MAIL, COMPOSE('', 'Hi')));
  silent('gomail', 'subject_filled', view(MAIL, COMPOSE('carol@example.com', '')));
  silent('gomail', 'subject_filled', view(MAIL, COMPOSE('carol@example.com', 'No Subject')));
  silent('gomail', 'send_visible', view(MAIL, COMPOSE('a@b.c', 'x', ' disabled')));
  // A draft is not a sent email; trashing emails and a trash snackbar are not either.
  const draftOnly = { differences: { emails: { added: [{ ...SENT_EMAIL, sent: false, draft: true }], updated: [{ id: 3, trash: true }] } } };
  silent('gomail', 'sent_confirmation', view(MAIL, INBOX, draftOnly));
  silent('gomail', 'send_visible', view(MAIL, INBOX, draftOnly));
  silent(
    'gomail',
    'sent_confirmation',
    view(MAIL, INBOX, { initialfinaldiff: { updated: { ui: { snackbar: { message: '4 conversations moved to trash' } }, email: { emails: { '3': { trash: true } } } } } }),
  );
  silent('gomail', 'sent_confirmation', view(MAIL, INBOX, { initialfinaldiff: { updated: { ui: { snackbar: { message: 'Message not sent' } } } } }));
  // The same compose window on a page the agent wrote itself (goto data:...) earns nothing.
  silent('gomail', 'compose_opened', view('data:text/html,<dialog>New Message</dialog>', COMPOSE('', '')));
  silent('gomail', 'send_visible', view('about:blank', COMPOSE('', '')));
});

test('gomail: a sent email implies the earlier funnel steps it proves', () => {
  const v = view(MAIL, INBOX, { differences: { emails: { added: [SENT_EMAIL] } } });
  for (const name of ['compose_opened', 'recipient_filled', 'subject_filled', 'send_visible', 'sent_confirmation']) fires('gomail', name, v);
  const noSubject = view(MAIL, INBOX, { differences: { emails: { added: [{ ...SENT_EMAIL, subject: 'No Subject' }] } } });
  silent('gomail', 'subject_filled', noSubject);
});

// ---------------------------------------------------------------------------------------------------------
// GoCalendar

const CAL = 'https://real-gocalendar.example.app/';
const CAL_MAIN = [
  '[1] button "Create" @(60,100)',
  '[2] heading "July 2024" @(300,60)',
  '[3] button "Team sync, 10am" @(500,300)',
  '[4] textbox "Search" value="gym" @(800,40)',
  '[5] button "Create event" @(60,140)',
];
const EDITOR = (title: string, date = '2024-07-18', allDay = 'unchecked') => [
  ...CAL_MAIN,
  '[20] heading "New event" @(600,200)',
  `[21] textbox "Add title" value=${JSON.stringify(title)} @(600,240)`,
  `[22] textbox "Start date" type=date value=${JSON.stringify(date)} @(600,280)`,
  '[23] combobox "Start time" value="10:00 AM" options="9:00 AM | 10:00 AM | 11:00 AM" @(700,280)',
  `[24] checkbox "All day" ${allDay} @(600,320)`,
  '[25] textbox "Location" value="" @(600,360)',
  '[26] button "Save" @(700,500)',
  '[27] button "Cancel" @(600,500)',
];
const NEW_EVENT = { id: 'e1', title: 'Buy gym clothes', start: '2024-07-22T15:00:00.000Z', end: '2024-07-22T16:00:00.000Z', allDay: false, location: '' };

test('gocalendar: each milestone fires on its evidence', () => {
  fires('gocalendar', 'create_event_clicked', view(CAL, EDITOR('')));
  fires('gocalendar', 'create_event_clicked', view(CAL, [...CAL_MAIN, '[30] dialog "Create event" @(1,1)']));
  fires('gocalendar', 'title_entered', view(CAL, EDITOR('Buy gym clothes')));
  fires('gocalendar', 'datetime_set', view(CAL, EDITOR('Buy gym clothes', '2024-07-22')), view(CAL, EDITOR('Buy gym clothes')));
  fires('gocalendar', 'datetime_set', view(CAL, EDITOR('Camp', '2024-07-18', 'checked')), view(CAL, EDITOR('Camp')));
  fires('gocalendar', 'save_clicked', view(CAL, [...CAL_MAIN, '[40] button "Buy gym clothes, 8am" @(400,350)']), view(CAL, EDITOR('Buy gym clothes')));
  fires('gocalendar', 'save_clicked', view(CAL, [...CAL_MAIN, '[41] status "Event saved" @(100,690)']), view(CAL, EDITOR('x')));
  fires('gocalendar', 'event_created', view(CAL, CAL_MAIN, { differences: { events: { added: { e1: NEW_EVENT }, deleted: {}, updated: {} } } }));
  fires(
    'gocalendar',
    'event_created',
    view(CAL, CAL_MAIN, { initialfinaldiff: { added: { calendar: { myTasks: { t1: { title: 'Email Ashley', start: '2024-07-22T15:00:00Z' } } } } } }),
  );
  fires('gocalendar', 'event_created', view(CAL, [...CAL_MAIN, '[42] alert "Event created" @(100,690)']));
});

test('gocalendar: look-alikes do not fire', () => {
  // The main view has "Create" buttons and a filled search box: no editor, no title.
  for (const name of ['create_event_clicked', 'title_entered', 'datetime_set', 'save_clicked', 'event_created'])
    silent('gocalendar', name, view(CAL, CAL_MAIN), view(CAL, CAL_MAIN));
  silent('gocalendar', 'title_entered', view(CAL, EDITOR('')));
  // Opening the editor shows default dates: not a date the agent set. Typing a title is not either.
  silent('gocalendar', 'datetime_set', view(CAL, EDITOR('')), view(CAL, CAL_MAIN));
  silent('gocalendar', 'datetime_set', view(CAL, EDITOR('Meeting at 5pm')), view(CAL, EDITOR('')));
  // Cancel: the editor closes and the title shows nowhere.
  silent('gocalendar', 'save_clicked', view(CAL, CAL_MAIN), view(CAL, EDITOR('Buy gym clothes')));
  // Save refused: the editor stays with an error.
  silent('gocalendar', 'save_clicked', view(CAL, [...EDITOR('Buy gym clothes'), '[50] alert "Title is required" @(1,1)']), view(CAL, EDITOR('Buy gym clothes')));
  // Deleting an event is not creating one.
  const deleted = { differences: { events: { added: {}, deleted: { e9: { title: 'Dinner with friends' } }, updated: {} } } };
  silent('gocalendar', 'event_created', view(CAL, CAL_MAIN, deleted));
  silent('gocalendar', 'save_clicked', view(CAL, CAL_MAIN, deleted), view(CAL, CAL_MAIN));
  silent('gocalendar', 'event_created', view(CAL, [...CAL_MAIN, '[51] text "Events created this week: 3" @(1,1)']));
});

test('gocalendar: a created event implies editor, title and save', () => {
  const v = view(CAL, CAL_MAIN, { differences: { events: { added: { e1: NEW_EVENT } } } });
  for (const name of ['create_event_clicked', 'title_entered', 'save_clicked', 'event_created']) fires('gocalendar', name, v);
  silent('gocalendar', 'datetime_set', v, v);
  fires('gocalendar', 'datetime_set', view(CAL, CAL_MAIN, { differences: { events: { added: { e1: { ...NEW_EVENT, allDay: true } } } } }));
});

// ---------------------------------------------------------------------------------------------------------
// Omnizon

const SHOP = 'https://omnizon.example.app';
const SHOP_HOME = (typed = '', cart = 0) => [
  `[1] textbox "Search Omnizon" value=${JSON.stringify(typed)} @(500,40)`,
  '[2] button "Go" @(700,40)',
  `[3] link "Cart ${cart}" @(950,40)`,
  '[4] link "Today\'s Deals" @(100,80)',
  '[5] text "Cart" @(960,60)',
];
const ORDER = {
  initialfinaldiff: {
    added: { order: { orders: { o1: { id: 'o1', items: [{ id: '212', price: 39.99, quantity: 1 }], total: 39.99 } } } },
    updated: { router: { location: { pathname: '/confirmation' } } },
  },
};

test('omnizon: each milestone fires on its evidence', () => {
  fires('omnizon', 'search_results', view(`${SHOP}/search?q=cooking+pot`, SHOP_HOME('cooking pot')));
  fires('omnizon', 'search_results', view(`${SHOP}/`, [...SHOP_HOME('pot'), '[10] text "1-16 of 200 results for \\"cooking pot\\"" @(300,120)']));
  fires('omnizon', 'search_results', view(`${SHOP}/`, SHOP_HOME(), { initialfinaldiff: { updated: { filter: { searchQuery: 'cooking pot', searchInputValue: 'cooking pot' } } } }));
  fires('omnizon', 'product_page', view(`${SHOP}/product/212`, SHOP_HOME()));
  fires('omnizon', 'product_page', view(`${SHOP}/`, [...SHOP_HOME(), '[11] combobox "Quantity" value="1" options="1 | 2 | 3" @(900,300)', '[12] button "Add to Cart" @(900,340)']));
  fires('omnizon', 'add_to_cart', view(`${SHOP}/product/212`, [...SHOP_HOME(), '[13] text "Added to Cart" @(500,100)']));
  fires('omnizon', 'add_to_cart', view(`${SHOP}/product/212`, SHOP_HOME('', 1)), view(`${SHOP}/product/212`, SHOP_HOME('', 0)));
  fires('omnizon', 'add_to_cart', view(`${SHOP}/product/212`, SHOP_HOME(), { initialfinaldiff: { added: { cart: { cartItems: [{ id: '212', quantity: 1 }] } } } }));
  fires('omnizon', 'cart_page', view(`${SHOP}/cart`, SHOP_HOME('', 1)));
  fires('omnizon', 'cart_page', view(`${SHOP}/`, [...SHOP_HOME('', 1), '[14] heading "Shopping Cart" @(300,120)']));
  fires('omnizon', 'checkout_started', view(`${SHOP}/checkout`, SHOP_HOME('', 1)));
  fires('omnizon', 'checkout_started', view(`${SHOP}/`, [...SHOP_HOME('', 1), '[15] button "Place your order" @(900,300)']));
  fires('omnizon', 'checkout_started', view(`${SHOP}/`, SHOP_HOME(), ORDER));
  fires('omnizon', 'add_to_cart', view(`${SHOP}/`, SHOP_HOME(), ORDER));
});

test('omnizon: look-alikes do not fire', () => {
  const home = view(`${SHOP}/`, SHOP_HOME());
  for (const name of ['search_results', 'product_page', 'add_to_cart', 'cart_page', 'checkout_started']) silent('omnizon', name, home, home);
  // Typed into the search box, not submitted (the state only has searchInputValue).
  silent('omnizon', 'search_results', view(`${SHOP}/`, SHOP_HOME('cooking pot'), { initialfinaldiff: { updated: { filter: { searchInputValue: 'cooking pot' } } } }));
  // Results with per-item Add to Cart buttons: not a product page, and nothing was added.
  const results = view(`${SHOP}/search?q=pot`, [...SHOP_HOME('pot'), '[20] link "Cooking Pot 5qt" @(300,200)', '[21] button "Add to Cart" @(300,260)']);
  silent('omnizon', 'product_page', results);
  silent('omnizon', 'add_to_cart', results, results);
  // The cart page's "Proceed to checkout" button is not checkout; an emptied cart is not an add.
  const cart = view(`${SHOP}/cart`, [...SHOP_HOME('', 1), '[22] button "Proceed to checkout" @(900,300)']);
  silent('omnizon', 'checkout_started', cart);
  silent('omnizon', 'add_to_cart', view(`${SHOP}/cart`, SHOP_HOME(), { initialfinaldiff: { deleted: { cart: { cartItems: [{ id: '212', quantity: 1 }] } } } }));
  silent('omnizon', 'cart_page', view(`${SHOP}/cartography-books`, SHOP_HOME()));
});

// ---------------------------------------------------------------------------------------------------------
// Zilloft

const HOMES = 'https://real-zilloft.example.app';
const Z_HOME = (typed = '') => [
  `[1] combobox "Search by city, ZIP or address" value=${JSON.stringify(typed)} @(500,300)`,
  '[2] button "Search" @(700,300)',
  '[3] link "Buy" @(100,40)',
  '[4] link "Homes" @(160,40)',
];
const Z_RESULTS = (maxPrice = 'No max', extra: string[] = []) => [
  ...Z_HOME('Boston, MA'),
  `[10] combobox "Max price" value=${JSON.stringify(maxPrice)} @(400,100)`,
  '[11] button "Beds & Baths" @(550,100)',
  '[12] text "Real Estate & Homes For Sale" @(300,140)',
  '[13] link "$450,000 3 bds 2 ba 1,200 sqft 12 Elm St, Boston, MA 02108" @(300,300)',
  ...extra,
];
const TOUR = {
  differences: {
    requestTours: {
      added: {
        '0': {
          id: 'r1',
          requestTourData: { formValues: { name: 'A', email: 'a@b.c', phone: '1', message: 'I am interested in 12 Elm St' }, options: [{ date: '2024-07-19', time: '1:00 PM' }] },
        },
      },
    },
  },
};

test('zilloft: each milestone fires on its evidence', () => {
  fires('zilloft', 'search_performed', view(`${HOMES}/search?location=Boston%2C%20MA`, Z_RESULTS()));
  fires('zilloft', 'search_performed', view(`${HOMES}/`, [...Z_HOME('Boston'), '[20] text "24 homes" @(300,140)']));
  fires('zilloft', 'search_performed', view(`${HOMES}/`, Z_HOME(), { initialfinaldiff: { updated: { homes: { searchTerm: 'Boston, MA' } } } }));
  fires('zilloft', 'filters_applied', view(`${HOMES}/search?location=Boston&maxPrice=500000`, Z_RESULTS()));
  fires('zilloft', 'filters_applied', view(`${HOMES}/search`, Z_RESULTS('$500,000')), view(`${HOMES}/search`, Z_RESULTS('No max')));
  const renamed = Z_RESULTS().map((l) => (l.startsWith('[11] ') ? '[11] button "3+ bd, 2+ ba" @(550,100)' : l));
  fires('zilloft', 'filters_applied', view(`${HOMES}/search`, renamed), view(`${HOMES}/search`, Z_RESULTS()));
  fires(
    'zilloft',
    'filters_applied',
    view(`${HOMES}/search`, Z_RESULTS('No max', ['[22] radio "3+" checked @(1,1)'])),
    view(`${HOMES}/search`, Z_RESULTS('No max', ['[22] radio "3+" unchecked @(1,1)'])),
  );
  fires('zilloft', 'filters_applied', view(`${HOMES}/search`, Z_RESULTS(), { initialfinaldiff: { updated: { filters: { maxPrice: 500000, minBedrooms: 2 } } } }));
  fires('zilloft', 'listing_viewed', view(`${HOMES}/homedetails/12-elm-st-boston-ma/2077`, Z_HOME()));
  fires('zilloft', 'listing_viewed', view(`${HOMES}/search`, [...Z_RESULTS(), '[30] button "Request a tour" @(900,200)']));
  fires('zilloft', 'listing_viewed', view(`${HOMES}/`, Z_HOME(), TOUR));
  fires(
    'zilloft',
    'listing_viewed',
    view(`${HOMES}/`, Z_HOME(), { initialfinaldiff: { added: { tourRequests: { contactAgentList: { '0': { contactAgentData: { formValues: { name: 'A' } } } } } } } }),
  );
});

test('zilloft: look-alikes do not fire', () => {
  const home = view(`${HOMES}/`, Z_HOME(), {
    initialfinaldiff: { added: { config: { zilloft: { run_id: '0', location: 'x' } } }, updated: { router: { location: { pathname: '/', search: '?q=1' } } } },
  });
  for (const name of ['search_performed', 'filters_applied', 'listing_viewed']) silent('zilloft', name, home, home);
  // A place typed into the box and not submitted.
  silent('zilloft', 'search_performed', view(`${HOMES}/`, Z_HOME('Boston, MA'), { initialfinaldiff: { updated: { search: { searchInputValue: 'Boston, MA' } } } }));
  // Results page as it came: filters at their defaults, listing cards with prices and beds, a price in the
  // listing data of the state: no filter was set; nor by "Any"/"No max"/0.
  const results = view(`${HOMES}/search?location=Boston`, Z_RESULTS(), { initialfinaldiff: { updated: { homes: { list: { '0': { price: 450000, bedrooms: 3 } } } } } });
  silent('zilloft', 'filters_applied', results, results);
  silent('zilloft', 'filters_applied', view(`${HOMES}/search?maxPrice=any&beds=0`, Z_RESULTS()));
  silent('zilloft', 'filters_applied', view(`${HOMES}/search`, Z_RESULTS(), { initialfinaldiff: { updated: { filters: { maxPrice: 0, minBedrooms: 'Any' } } } }));
  // Opening a filter dropdown shows options; none is chosen yet.
  const opened = view(`${HOMES}/search`, Z_RESULTS('No max', ['[30] button "3+" @(1,1)', '[31] button "Under $500K" @(1,2)', '[32] radio "2+" unchecked @(1,3)']));
  silent('zilloft', 'filters_applied', opened, view(`${HOMES}/search`, Z_RESULTS()));
  // Search results are not a listing page (the "Homes" link neither).
  silent('zilloft', 'listing_viewed', results);
  silent('zilloft', 'listing_viewed', view(`${HOMES}/homes/for_sale`, Z_RESULTS()));
});

// ---------------------------------------------------------------------------------------------------------
// Registry ↔ weights

test('every site detector has a weight and every weight a detector, in the same order', () => {
  assert.deepEqual(Object.keys(SITE_MILESTONES).sort(), Object.keys(W.sites).sort());
  for (const [site, detectors] of Object.entries(SITE_MILESTONES)) {
    assert.deepEqual(
      detectors.map((d) => d.name),
      Object.keys((W.sites as Record<string, Record<string, number>>)[site]),
      site,
    );
    for (const d of detectors) assert.ok(d.evidence.length > 10, `${site}.${d.name} documents its evidence`);
  }
  assert.deepEqual(milestonesFor(null), []);
  assert.deepEqual(milestonesFor('dashdish'), []);
  assert.deepEqual(milestonesFor('__proto__'), []);
});

// ---------------------------------------------------------------------------------------------------------
// Shaping

const A = view(`${MAIL}`, INBOX);
const B = view(`${MAIL}`, COMPOSE('', ''));
const C = view(`${MAIL}`, COMPOSE('carol@example.com', ''));

test('summary and terms of a compose step (the Temporal UI line)', () => {
  const s0 = initialRewardState(A, 'gomail');
  const { breakdown } = computeReward(step({ site: 'gomail', before: A, after: B }), s0, W);
  assert.deepEqual(termNames(breakdown), ['valid_action', 'new_state', 'milestone:gomail.compose_opened', 'milestone:gomail.send_visible']);
  assert.equal(breakdown.total, 0.8);
  assert.equal(summarizeBreakdown(breakdown), '+0.1 valid, +0.2 new state, +0.3 gomail.compose_opened, +0.2 gomail.send_visible = 0.8');
  assert.equal(
    summarizeBreakdown({
      total: 0.6,
      terms: [
        { term: 'valid_action', value: 0.1 },
        { term: 'new_state', value: 0.2 },
        { term: 'milestone:gomail.compose_opened', value: 0.3 },
      ],
    }),
    '+0.1 valid, +0.2 new state, +0.3 gomail.compose_opened = 0.6',
  );
  assert.equal(
    summarizeBreakdown({
      total: -1.5,
      terms: [
        { term: 'invalid_action', value: -0.5 },
        { term: 'loop', value: -1 },
      ],
    }),
    '-0.5 invalid, -1 loop = -1.5',
  );
  assert.equal(summarizeBreakdown(null as never), 'no terms = 0');
});

test('a milestone fires at most once per episode', () => {
  let s = initialRewardState(A, 'gomail');
  const r1 = computeReward(step({ site: 'gomail', before: A, after: B }), s, W);
  s = r1.state;
  assert.ok(s.fired.includes('gomail.compose_opened'));
  const r2 = computeReward(step({ site: 'gomail', before: B, after: A, actionKey: 'close' }), s, W);
  const r3 = computeReward(step({ site: 'gomail', before: A, after: B, actionKey: 'open' }), r2.state, W);
  assert.ok(!termNames(r3.breakdown).some((t) => t.startsWith('milestone:')), JSON.stringify(r3.breakdown));
  // Another step with new evidence earns only the new milestone.
  const r4 = computeReward(step({ site: 'gomail', before: B, after: C, actionKey: 'type' }), r3.state, W);
  assert.deepEqual(termNames(r4.breakdown), ['valid_action', 'new_state', 'milestone:gomail.recipient_filled']);
  assert.equal(r4.state.fired.filter((f) => f === 'gomail.compose_opened').length, 1);
});

test('evidence already on the reset page is not paid', () => {
  const s0 = initialRewardState(B, 'gomail');
  assert.deepEqual(s0.fired, ['gomail.compose_opened', 'gomail.send_visible']);
  assert.deepEqual(s0.visited, [stateKey(B)]);
  const r = computeReward(step({ site: 'gomail', before: B, after: C }), s0, W);
  assert.deepEqual(termNames(r.breakdown), ['valid_action', 'new_state', 'milestone:gomail.recipient_filled']);
  assert.deepEqual(initialRewardState(B).fired, [], 'without a site nothing is pre-marked');
  assert.deepEqual(initialRewardState(), { fired: [], visited: [], lastActionKey: null, lastStateKey: null });
});

test('first-visit bonus only once per state; the reset page counts as visited', () => {
  let s = initialRewardState(A);
  const go = (before: RewardView, after: RewardView, actionKey: string) => {
    const r = computeReward(step({ before, after, actionKey }), s, W);
    s = r.state;
    return termNames(r.breakdown);
  };
  assert.deepEqual(go(A, B, 'open'), ['valid_action', 'new_state']);
  assert.deepEqual(go(B, A, 'close'), ['valid_action'], 'back to the reset page: already visited');
  assert.deepEqual(go(A, B, 'open'), ['valid_action'], 'B again');
  assert.deepEqual(go(B, C, 'type'), ['valid_action', 'new_state']);
  assert.equal(new Set(s.visited).size, s.visited.length);
});

test('a loop (same action on an unchanged state it does not change) is penalised; on a changed state it is not', () => {
  const key = '{"type":"click","x":500,"y":500}';
  let s = initialRewardState(A);
  const r1 = computeReward(step({ before: A, after: A, actionKey: key }), s, W);
  assert.deepEqual(termNames(r1.breakdown), ['valid_action'], 'the first time is not a loop');
  const r2 = computeReward(step({ before: A, after: A, actionKey: key }), r1.state, W);
  assert.deepEqual(termNames(r2.breakdown), ['valid_action', 'loop']);
  assert.equal(r2.breakdown.total, -0.9);
  const r3 = computeReward(step({ before: A, after: A, actionKey: key }), r2.state, W);
  assert.equal(r3.breakdown.total, -0.9, 'and every further repeat');

  // The same action on states that keep changing (scrolling through a list) is not a loop.
  s = initialRewardState(A);
  const scroll = '{"type":"scroll","direction":"down","amount":300}';
  const x = computeReward(step({ before: A, after: B, actionKey: scroll }), s, W);
  const y = computeReward(step({ before: B, after: C, actionKey: scroll }), x.state, W);
  assert.ok(!termNames(y.breakdown).includes('loop'));
  // Same action in the same state as last time, but this time the state changed: not a loop either.
  const z1 = computeReward(step({ before: A, after: A, actionKey: key }), initialRewardState(A), W);
  const z2 = computeReward(step({ before: A, after: B, actionKey: key }), z1.state, W);
  assert.ok(!termNames(z2.breakdown).includes('loop'));
  // A different action in the same unchanged state is not a loop.
  const d2 = computeReward(step({ before: A, after: A, actionKey: 'other' }), z1.state, W);
  assert.ok(!termNames(d2.breakdown).includes('loop'));
});

test('an invalid action gets -0.5 and nothing from the page', () => {
  const s0 = initialRewardState(A, 'gomail');
  const sent = view(MAIL, COMPOSE('carol@example.com', 'Hi'), { differences: { emails: { added: [SENT_EMAIL] } } });
  const r = computeReward(step({ site: 'gomail', valid: false, actionKey: null, before: A, after: sent }), s0, W);
  assert.deepEqual(r.breakdown.terms, [{ term: 'invalid_action', value: -0.5, detail: 'output did not parse into an action' }]);
  assert.equal(r.breakdown.total, -0.5);
  assert.deepEqual(r.state.fired, s0.fired, 'no milestone fired');
  assert.ok(r.state.visited.includes(stateKey(sent)), 'the page it ended on is recorded');
  // A rejected action repeated on the same unchanged page is also a loop.
  const rejected = '{"type":"click_element","id":999}';
  const i1 = computeReward(step({ valid: false, actionKey: rejected, before: A, after: A }), s0, W);
  const i2 = computeReward(step({ valid: false, actionKey: rejected, before: A, after: A }), i1.state, W);
  assert.deepEqual(termNames(i2.breakdown), ['invalid_action', 'loop']);
  assert.equal(i2.breakdown.total, -1.5);
  // Unparseable output twice is not a loop (there is no action to repeat).
  const u2 = computeReward(
    step({ valid: false, actionKey: null, before: A, after: A }),
    computeReward(step({ valid: false, actionKey: null, before: A, after: A }), s0, W).state,
    W,
  );
  assert.deepEqual(termNames(u2.breakdown), ['invalid_action']);
});

test('MiniWoB (site null): general shaping plus the environment reward; task success +10', () => {
  const before = view('http://127.0.0.1:8765/miniwob/click-button.html', [
    '[1] text "Click on the OK button." @(80,30)',
    '[2] button "OK" @(60,120)',
    '[3] button "Cancel" @(60,160)',
  ]);
  const after = view('http://127.0.0.1:8765/miniwob/click-button.html', ['[1] text "Click on the OK button." @(80,30)']);
  const r = computeReward(step({ before, after, envReward: 0.83, taskSuccess: true }), initialRewardState(before), W);
  assert.deepEqual(termNames(r.breakdown), ['valid_action', 'new_state', 'env_reward', 'task_success']);
  assert.equal(r.breakdown.total, 11.13, 'rounded to 1e-9: no float noise');
  assert.deepEqual(r.state.fired, []);
  const fail = computeReward(step({ before, after, envReward: -1, taskSuccess: false }), initialRewardState(before), W);
  assert.deepEqual(termNames(fail.breakdown), ['valid_action', 'new_state', 'env_reward']);
  assert.equal(fail.breakdown.total, -0.7);
  const scaled = computeReward(step({ before, after, envReward: 1 }), initialRewardState(before), { ...W, general: { ...W.general, env_reward_scale: 2.5 } });
  assert.equal(scaled.breakdown.terms.find((t) => t.term === 'env_reward')?.value, 2.5);
  const nan = computeReward(step({ before, after, envReward: Number.NaN }), initialRewardState(before), W);
  assert.ok(!termNames(nan.breakdown).includes('env_reward'));
  // A REAL site judged successful.
  const ok = computeReward(step({ site: 'omnizon', before: view(`${SHOP}/`, SHOP_HOME()), after: view(`${SHOP}/`, SHOP_HOME()), taskSuccess: true }), initialRewardState(), W);
  assert.equal(ok.breakdown.terms.find((t) => t.term === 'task_success')?.value, 10);
});

test('no new-state bonus for pages the agent writes itself', () => {
  const r = computeReward(step({ before: A, after: view('data:text/html,<p>1</p>', ['[1] text "1" @(1,1)']) }), initialRewardState(A), W);
  assert.deepEqual(termNames(r.breakdown), ['valid_action']);
});

test('state keys: positions, focus, ids, query and typed text do not make a new state; content does', () => {
  const base = view(`${MAIL}?x=1`, ['[1] button "Compose" @(60,120)', '[2] textbox "Search mail" value="a" focused @(400,40)']);
  const same = view(`${MAIL}?x=2#top`, ['[7] button "Compose" @(61,300)', '[8] textbox "Search mail" value="abc" @(400,90)']);
  assert.equal(stateKey(base), stateKey(same));
  assert.notEqual(stateKey(base), stateKey(view(`${MAIL}?x=1`, ['[1] button "Compose" @(60,120)', '[2] textbox "Search mail" value="" @(400,40)'])), 'empty vs filled');
  assert.notEqual(stateKey(base), stateKey(view(`${MAIL}other`, ['[1] button "Compose" @(60,120)', '[2] textbox "Search mail" value="a" @(400,40)'])), 'path');
  assert.notEqual(stateKey(base), stateKey(view(`${MAIL}?x=1`, ['[1] button "Compose" @(60,120)'])), 'content');
  const sel = (v: string) => view(MAIL, [`[1] combobox "Sort" value="${v}" options="Price | Beds" @(1,1)`]);
  assert.notEqual(stateKey(sel('Price')), stateKey(sel('Beds')), 'a select keeps its value');
  assert.equal(stateKey({ ...base, clientState: { a: 1 } }), stateKey({ ...base, clientState: { a: 2 } }), 'client state excluded');
  assert.match(stateKey(base), /^[0-9a-f]{8}$/);
  assert.equal(fnv1a32(''), '811c9dc5');
  assert.equal(fnv1a32('a'), 'e40c292c');
  assert.equal(fnv1a32('foobar'), 'bf9cf968');
});

test('visited stays bounded', () => {
  let s: RewardState = initialRewardState(A);
  for (let i = 0; i < MAX_VISITED + 40; i++) {
    const before = view(MAIL, [`[1] text "page ${i}" @(1,1)`]);
    const after = view(MAIL, [`[1] text "page ${i + 1}" @(1,1)`]);
    s = computeReward(step({ before, after, actionKey: `k${i}` }), s, W).state;
  }
  assert.equal(s.visited.length, MAX_VISITED);
  assert.ok(JSON.stringify(s).length < 10_000);
});

test('breakdown total equals the sum of its terms; inputs are not mutated', () => {
  const views = [A, B, C, view(MAIL, INBOX, { differences: { emails: { added: [SENT_EMAIL] } } }), view('about:blank', [])];
  let s = initialRewardState(A, 'gomail');
  for (let i = 0; i < 60; i++) {
    const before = views[i % views.length];
    const after = views[(i * 7 + 3) % views.length];
    const input = step({
      site: i % 3 === 0 ? null : 'gomail',
      valid: i % 5 !== 0,
      actionKey: i % 4 === 0 ? null : `a${i % 3}`,
      before,
      after,
      envReward: i % 6 === 0 ? 0.3 : 0,
      taskSuccess: i % 13 === 0 ? true : null,
    });
    const frozenState = JSON.stringify(s);
    const frozenInput = JSON.stringify(input);
    const r = computeReward(input, s, W);
    assert.equal(JSON.stringify(s), frozenState);
    assert.equal(JSON.stringify(input), frozenInput);
    const sum = Math.round(r.breakdown.terms.reduce((a, t) => a + t.value, 0) * 1e9) / 1e9;
    assert.equal(r.breakdown.total, sum === 0 ? 0 : sum);
    assert.ok(r.breakdown.terms.every((t) => t.value !== 0 && Number.isFinite(t.value)));
    assert.deepEqual(JSON.parse(JSON.stringify(r.state)), r.state, 'state is plain JSON');
    s = r.state;
  }
});

// ---------------------------------------------------------------------------------------------------------
// Weights from YAML

test('configs/rewards.yaml holds exactly the schema defaults', () => {
  const path = join(ROOT, 'configs', 'rewards.yaml');
  const raw = parseYaml(readFileSync(path, 'utf8')) as unknown;
  assert.deepEqual(raw, rewardWeightsSchema.parse({}));
  assert.deepEqual(loadRewardWeights(path), defaultRewardWeights());
  assert.deepEqual(W.general, { valid_action: 0.1, invalid_action: -0.5, new_state: 0.2, loop: -1, revisit: 0, task_success: 10, env_reward_scale: 1 });
});

test('a custom YAML file changes the reward', () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-rewards-'));
  const file = join(dir, 'rewards.yaml');
  writeFileSync(file, 'general:\n  valid_action: 0\n  new_state: 0.5\nsites:\n  gomail:\n    compose_opened: 1.5\n');
  const custom: RewardWeights = loadRewardWeights(file);
  assert.equal(custom.sites.gomail.recipient_filled, 0.2, 'unspecified values keep their defaults');
  const input = step({ site: 'gomail', before: A, after: B });
  const def = computeReward(input, initialRewardState(A), W);
  const cus = computeReward(input, initialRewardState(A), custom);
  assert.equal(def.breakdown.total, 0.8);
  assert.equal(summarizeBreakdown(cus.breakdown), '+0.5 new state, +1.5 gomail.compose_opened, +0.2 gomail.send_visible = 2.2');
  // A milestone weighted 0 neither pays nor counts as fired.
  writeFileSync(file, 'sites:\n  gomail:\n    send_visible: 0\n');
  const off = computeReward(input, initialRewardState(A), loadRewardWeights(file));
  assert.ok(!off.state.fired.includes('gomail.send_visible'));
  writeFileSync(file, '');
  assert.deepEqual(loadRewardWeights(file), W, 'an empty file is all defaults');
});

test('bad weight files give errors that name the field', () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-rewards-bad-'));
  const write = (name: string, text: string) => {
    const p = join(dir, name);
    writeFileSync(p, text);
    return p;
  };
  const expectError = (path: string, ...patterns: RegExp[]) =>
    assert.throws(
      () => loadRewardWeights(path),
      (err: Error) => {
        assert.ok(err instanceof ConfigError, String(err));
        for (const p of patterns) assert.match(err.message, p);
        return true;
      },
    );
  expectError(write('type.yaml', 'general:\n  loop: lots\n'), /general\.loop/);
  expectError(write('sign.yaml', 'general:\n  loop: 1\n  task_success: -3\n'), /general\.loop/, /general\.task_success/);
  expectError(write('site.yaml', 'sites:\n  dashdish:\n    order_placed: 1\n'), /sites\.dashdish: unknown site/);
  expectError(write('ms.yaml', 'sites:\n  gomail:\n    compose_openned: 0.3\n'), /sites\.gomail\.compose_openned: unknown gomail milestone/, /compose_opened/);
  expectError(write('gen.yaml', 'general:\n  valid: 0.1\nextra: 1\n'), /general\.valid: unknown general weight/, /extra: unknown section/);
  expectError(write('yaml.yaml', 'general: [unclosed'), /not valid YAML/);
  expectError(join(dir, 'missing.yaml'), /cannot read reward weights file/);
  assert.throws(() => parseRewardWeights({ sites: { zilloft: { listing_viewed: 'high' } } }), /sites\.zilloft\.listing_viewed/);
});

// ---------------------------------------------------------------------------------------------------------
// Robustness

test('detectors and shaping never throw on garbage', () => {
  const cyclic: Record<string, unknown> = { a: 1 };
  cyclic.self = cyclic;
  const cyclicDiff: Record<string, unknown> = {};
  cyclicDiff.initialfinaldiff = { added: cyclicDiff, updated: cyclicDiff };
  cyclicDiff.differences = { emails: { added: [cyclicDiff, null, 3] }, events: { added: cyclicDiff } };
  const hostile = new Proxy(
    {},
    {
      get() {
        throw new Error('boom');
      },
      ownKeys() {
        throw new Error('boom');
      },
    },
  );
  const huge = 'x'.repeat(2_000_000);
  const manyLines = Array.from({ length: 50_000 }, (_, i) => `[${i}] button "Send" value="${i}" @(1,1)`).join('\n');
  const garbage: unknown[] = [
    null,
    undefined,
    42,
    'text',
    [],
    hostile,
    { url: 5, axtree: {}, clientState: 'x' },
    { url: null, axtree: null, clientState: null },
    { url: 'https://a.b/', axtree: 12, clientState: 3 },
    { url: huge, axtree: huge, clientState: huge },
    { url: 'https://a.b/' + '/'.repeat(100_000), axtree: '['.repeat(500_000) + '"'.repeat(500_000) },
    { url: 'https://a.b/', axtree: '[1] button "' + '\\'.repeat(300_000) },
    { url: 'https://a.b/', axtree: '[1] textbox ' + 'value='.repeat(100_000) + ' @(1,1)' },
    { url: 'https://a.b/', axtree: manyLines },
    { url: 'https://a.b/', axtree: '', clientState: cyclic },
    { url: 'https://a.b/', axtree: '', clientState: cyclicDiff },
    { url: 'https://a.b/', axtree: '', clientState: hostile },
    {
      url: 'https://a.b/',
      axtree: '',
      clientState: { initialfinaldiff: { added: [1, 2], updated: 'x' }, differences: { emails: { added: 'x' }, events: { added: [null] }, requestTours: { added: 7 } } },
    },
    {
      url: 'https://a.b/',
      axtree: '',
      clientState: {
        initialfinaldiff: { added: { email: { emails: { a: { to: 5, subject: {}, sent: 'yes', replies: 9 } } }, order: { orders: { x: { items: 'none' } } }, cart: null } },
      },
    },
    { url: '%E0%A4%A?q=%E0%A4%A&maxPrice=%ZZ', axtree: '[1] link "x" @(a,b)' },
  ];
  const started = Date.now();
  for (const [site, detectors] of Object.entries(SITE_MILESTONES)) {
    for (const d of detectors) {
      for (const v of garbage) {
        for (const p of [garbage[0], garbage[9], garbage[13], v]) {
          const out = d.detect(v as RewardView, p as RewardView);
          assert.ok(out === null || typeof out === 'string', `${site}.${d.name}`);
        }
      }
    }
  }
  for (const v of garbage) {
    assert.doesNotThrow(() => stateKey(v as RewardView));
    for (const site of [null, 'gomail', 'gocalendar', 'omnizon', 'zilloft', 'nope']) {
      const r = computeReward({ site, valid: true, actionKey: 'k', before: v as RewardView, after: v as RewardView, taskSuccess: null, envReward: 0 }, v as RewardState, W);
      assert.equal(typeof r.breakdown.total, 'number');
      assert.doesNotThrow(() => initialRewardState(v as RewardView, site));
    }
  }
  // Bounded work: the whole sweep stays far from anything pathological (not a speed assertion).
  assert.ok(Date.now() - started < 120_000);
});

test('reward code has no Node APIs or nondeterminism (it may run in workflow code)', () => {
  const dir = join(ROOT, 'lib', 'rewards');
  const files = ['shaping.ts', 'milestones.ts', 'weights.ts', 'types.ts', ...readdirSync(join(dir, 'sites')).map((f) => join('sites', f))];
  for (const f of files) {
    const src = readFileSync(join(dir, f), 'utf8');
    assert.doesNotMatch(src, /from ['"](node:|fs|path|os|crypto)|require\(/, f);
    assert.doesNotMatch(src, /Date\.now|new Date|Math\.random|performance\.now|process\./, f);
  }
});
