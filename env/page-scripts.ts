/**
 * JavaScript evaluated inside MiniWoB task pages. Kept as plain source text (not TS functions handed to
 * page.evaluate) so that the TS compiler / tsx cannot inject helpers (e.g. `__name`) that do not exist in the
 * page. Installed once per navigation as `window.__halo`.
 */

/** What `__halo.state()` and `__halo.afterAction()` return. */
export interface PageEpisodeState {
  done: boolean;
  /** WOB_RAW_REWARD_GLOBAL: no time penalty. */
  raw: number;
  /** WOB_REWARD_GLOBAL: positive rewards scaled by the share of the time limit left. */
  scaled: number;
  reason: string | null;
}

export interface AxTreeOptions {
  /** Screenshot magnification: one CSS px is `zoom` screenshot pixels. */
  zoom: number;
  /** Screenshot size in pixels (the 0-1000 grid spans it). */
  width: number;
  height: number;
  maxLines: number;
  maxChars: number;
}

export interface PageView {
  axtree: string;
  /** Document scroll offset (CSS px) of the visual viewport, for the screenshot clip. */
  scrollX: number;
  scrollY: number;
}

export const PAGE_SCRIPT = String.raw`(function () {
  if (window.__halo) return true;

  // MiniWoB's HUD (reward display, click visualiser, attention canvas) and the START cover: never shown to
  // the policy, never part of the tree, never given ids. The START cover is hidden because it reappears as
  // soon as an episode ends and a click on it would start a new episode.
  var HUD_IDS = { 'reward-display': 1, 'click-canvas': 1, 'sync-task-cover': 1, 'attention-canvas': 1 };
  var SKIP_TAGS = { SCRIPT: 1, STYLE: 1, NOSCRIPT: 1, TEMPLATE: 1, LINK: 1, META: 1, TITLE: 1, HEAD: 1, BR: 1, WBR: 1, OPTION: 1, OPTGROUP: 1, DATALIST: 1 };
  var FORMAT_TAGS = { B: 1, STRONG: 1, I: 1, EM: 1, U: 1, S: 1, SMALL: 1, BIG: 1, SUB: 1, SUP: 1, CODE: 1, FONT: 1, MARK: 1, TT: 1, KBD: 1, ABBR: 1, Q: 1, CITE: 1, DEL: 1, INS: 1, VAR: 1, SAMP: 1 };
  var SHAPES = { circle: 1, rect: 1, ellipse: 1, polygon: 1, polyline: 1, path: 1, line: 1 };
  // Roles whose subtree is summarised by the element's own line.
  var CONSUME = { button: 1, link: 1, option: 1, textbox: 1, searchbox: 1, combobox: 1, listbox: 1, checkbox: 1, radio: 1, slider: 1, spinbutton: 1, img: 1, canvas: 1, graphic: 1, 'switch': 1, menuitemcheckbox: 1, menuitemradio: 1 };
  var INTERACTIVE = 'a, button, input, select, textarea, canvas, svg, img, [role], [tabindex], [contenteditable]';
  var nextId = 1;

  var style = document.createElement('style');
  style.id = 'halo-style';
  style.textContent = '#reward-display, #click-canvas, #attention-canvas, #sync-task-cover { display: none !important; }';
  (document.head || document.documentElement).appendChild(style);

  function skipEl(el) {
    return SKIP_TAGS[el.tagName.toUpperCase()] === 1 || HUD_IDS[el.id] === 1;
  }

  // A new episode on the same page numbers its elements from 1 again, as a freshly loaded page does.
  function resetIds() {
    var marked = document.querySelectorAll('[data-halo-id]');
    for (var i = 0; i < marked.length; i++) marked[i].removeAttribute('data-halo-id');
    nextId = 1;
  }

  // Pre-order walk; new elements get the next number, existing ones keep theirs. A clone of an element
  // (jQuery .clone() copies attributes) is renumbered so that ids stay unique.
  function assignIds() {
    if (!document.body) return;
    var seen = Object.create(null);
    var stack = [document.body];
    while (stack.length) {
      var el = stack.pop();
      if (skipEl(el)) continue;
      var id = el.getAttribute('data-halo-id');
      if (id === null || seen[id]) {
        id = String(nextId++);
        el.setAttribute('data-halo-id', id);
      }
      seen[id] = 1;
      for (var c = el.lastElementChild; c; c = c.previousElementSibling) stack.push(c);
    }
  }

  function norm(s) { return String(s == null ? '' : s).replace(/\s+/g, ' ').trim(); }
  function clip(s, n) { return s.length <= n ? s : s.slice(0, n - 1) + '\u2026'; }
  function q(s, n) { return JSON.stringify(clip(norm(s), n)); }
  function inter(a, b) {
    return { l: Math.max(a.l, b.l), t: Math.max(a.t, b.t), r: Math.min(a.r, b.r), b: Math.min(a.b, b.b) };
  }
  function isEmpty(a) { return a.r - a.l < 0.5 || a.b - a.t < 0.5; }

  function ownText(el) {
    var s = '';
    for (var n = el.firstChild; n; n = n.nextSibling) if (n.nodeType === 3) s += ' ' + n.data;
    return norm(s);
  }

  // Rendered text (innerText puts spaces between boxes and skips hidden parts); SVG has only textContent.
  function fullText(el) {
    return norm(typeof el.innerText === 'string' ? el.innerText : el.textContent);
  }

  // Text of mixed inline content, leaving out form controls and buttons (they get their own lines).
  function inlineText(el) {
    var s = '';
    for (var n = el.firstChild; n; n = n.nextSibling) {
      if (n.nodeType === 3) { s += n.data; continue; }
      if (n.nodeType !== 1) continue;
      var t = n.tagName.toUpperCase();
      if (t === 'BUTTON' || t === 'INPUT' || t === 'SELECT' || t === 'TEXTAREA' || skipEl(n)) continue;
      if (t === 'BR') { s += ' '; continue; }
      s += ' ' + (typeof n.innerText === 'string' ? n.innerText : n.textContent) + ' ';
    }
    return norm(s);
  }

  function classHint(el) {
    var c = typeof el.className === 'string' ? norm(el.className) : '';
    return c ? c.split(' ').slice(0, 3).join('.') : '';
  }

  function transparent(color) {
    return !color || color === 'transparent' || /^rgba\([^)]*,\s*0\)$/.test(color);
  }

  function leafGraphic(el, cs, vis) {
    if (vis.r - vis.l < 3 || vis.b - vis.t < 3) return null;
    var extras = [];
    var cls = classHint(el);
    var name = norm(el.getAttribute('title'));
    var image = (cs.backgroundImage && cs.backgroundImage !== 'none') || (cs.content && cs.content.indexOf('url(') >= 0);
    if (image) {
      if (cls) extras.push('class=' + cls);
      return { role: 'icon', name: name, extras: extras };
    }
    var filled = !transparent(cs.backgroundColor);
    var bordered = parseFloat(cs.borderTopWidth) > 0 && cs.borderTopStyle !== 'none' && !transparent(cs.borderTopColor);
    if (!filled && !bordered && cs.cursor !== 'pointer') return null;
    if (filled) extras.push('bg=' + cs.backgroundColor.replace(/\s+/g, ''));
    if (cls) extras.push('class=' + cls);
    return { role: 'box', name: name, extras: extras };
  }

  function labelText(el) {
    var parts = [];
    if (el.labels) for (var i = 0; i < el.labels.length; i++) parts.push(norm(el.labels[i].textContent));
    return norm(parts.join(' '));
  }

  function roleOf(el, tag) {
    var explicit = el.getAttribute('role');
    if (explicit) {
      var r = explicit.trim().split(/\s+/)[0];
      if (r !== 'presentation' && r !== 'none') return r;
    }
    if (el.namespaceURI === 'http://www.w3.org/2000/svg') {
      if (SHAPES[el.tagName] === 1) return 'graphic';
      if (el.tagName === 'text') return 'text';
      return null;
    }
    switch (tag) {
      case 'A': return 'link';
      case 'BUTTON': return 'button';
      case 'SELECT': return el.multiple || el.size > 1 ? 'listbox' : 'combobox';
      case 'TEXTAREA': return 'textbox';
      case 'IMG': return 'img';
      case 'CANVAS': return 'canvas';
      case 'LABEL': return 'label';
      case 'H1': case 'H2': case 'H3': case 'H4': case 'H5': case 'H6': return 'heading';
      case 'LI': return 'listitem';
      case 'TD': return 'cell';
      case 'TH': return 'columnheader';
      case 'INPUT':
        switch ((el.type || 'text').toLowerCase()) {
          case 'hidden': return null;
          case 'checkbox': return 'checkbox';
          case 'radio': return 'radio';
          case 'range': return 'slider';
          case 'number': return 'spinbutton';
          case 'button': case 'submit': case 'reset': case 'image': case 'file': return 'button';
          default: return 'textbox';
        }
    }
    if (el.isContentEditable && !(el.parentElement && el.parentElement.isContentEditable)) return 'textbox';
    if (el.hasAttribute('tabindex') && el.tabIndex >= 0) return 'focusable';
    return null;
  }

  function nameOf(el, role, tag) {
    var aria = norm(el.getAttribute('aria-label'));
    if (aria) return aria;
    switch (role) {
      case 'textbox': case 'searchbox': case 'spinbutton': case 'slider': case 'combobox': case 'listbox':
        if (tag === 'INPUT' || tag === 'TEXTAREA' || tag === 'SELECT') {
          return labelText(el) || norm(el.getAttribute('placeholder')) || norm(el.getAttribute('title'));
        }
        return role === 'textbox' ? norm(el.textContent) : '';
      case 'checkbox': case 'radio':
        if (tag === 'INPUT') return labelText(el) || norm(el.getAttribute('title'));
        return norm(el.textContent);
      case 'button': case 'link':
        if (tag === 'INPUT') return norm(el.value) || norm(el.getAttribute('title'));
        return norm(el.textContent) || norm(el.getAttribute('title'));
      case 'img':
        var src = el.getAttribute('src') || '';
        return norm(el.getAttribute('alt')) || norm(el.getAttribute('title')) || src.split(/[?#]/)[0].split('/').pop();
      case 'graphic':
        return el.tagName;
      case 'canvas': case 'focusable':
        return '';
    }
    return norm(el.textContent);
  }

  function extrasOf(el, role, tag, cs) {
    var out = [];
    if (tag === 'INPUT' && el.type === 'password') out.push('password');
    if (tag === 'INPUT' && role === 'textbox' && el.type && el.type !== 'text') {
      if (el.type !== 'password') out.push('type=' + el.type);
    }
    if (tag === 'INPUT' || tag === 'TEXTAREA') {
      if (role !== 'checkbox' && role !== 'radio' && role !== 'button') out.push('value=' + q(el.value, 80));
    } else if (tag === 'SELECT') {
      var sel = el.selectedIndex >= 0 ? el.options[el.selectedIndex] : null;
      out.push('value=' + q(sel ? sel.text : '', 60));
      var opts = [];
      for (var i = 0; i < el.options.length && i < 40; i++) opts.push(norm(el.options[i].text));
      out.push('options=' + q(opts.join(' | '), 200));
    } else if (role === 'slider' || role === 'spinbutton') {
      var v = el.getAttribute('aria-valuenow');
      if (v !== null) out.push('value=' + q(v, 40));
    }
    if (role === 'checkbox' || role === 'radio' || role === 'switch') {
      var checked = tag === 'INPUT' ? el.checked : el.getAttribute('aria-checked') === 'true';
      out.push(checked ? 'checked' : 'unchecked');
    }
    if (role === 'graphic') {
      var fill = el.getAttribute('fill') || cs.fill;
      if (fill && fill !== 'none') out.push('fill=' + norm(fill).replace(/\s+/g, ''));
    }
    if (el.getAttribute('aria-selected') === 'true') out.push('selected');
    var exp = el.getAttribute('aria-expanded');
    if (exp === 'true') out.push('expanded');
    else if (exp === 'false') out.push('collapsed');
    if (el.disabled === true || el.getAttribute('aria-disabled') === 'true') out.push('disabled');
    if (el.readOnly === true) out.push('readonly');
    if ((role === 'button' || role === 'link') && !norm(el.textContent) && !el.getAttribute('aria-label') && !el.getAttribute('title')) {
      var hint = classHint(el);
      if (hint) out.push('class=' + hint);
    }
    if (document.activeElement === el && el !== document.body) out.push('focused');
    return out;
  }

  // How an element's children relate to its text: 'simple' (no element children, or only inline
  // formatting: its text is one line), 'inline' (mixed inline content such as clickable spans: one line for
  // the whole text, then lines for the children), 'block' (structure: own text only, then the children).
  function contentKind(el) {
    var kind = 'simple';
    for (var c = el.firstElementChild; c; c = c.nextElementSibling) {
      var t = c.tagName.toUpperCase();
      if (t === 'BR' || t === 'WBR' || t === 'SCRIPT' || t === 'STYLE') continue;
      if (FORMAT_TAGS[t] === 1 && !c.firstElementChild && !c.hasAttribute('role') && !c.hasAttribute('tabindex')) continue;
      var d = getComputedStyle(c).display;
      if (d === 'none') continue;
      if (d.indexOf('inline') !== 0) return 'block';
      kind = 'inline';
    }
    return kind;
  }

  function axtree(opts) {
    assignIds();
    var zoom = opts.zoom;
    var region = { l: 0, t: 0, r: opts.width / zoom, b: opts.height / zoom };
    var lines = [];
    var omitted = 0;
    var chars = 0;

    function gx(x) { return Math.max(0, Math.min(1000, Math.round(x * zoom / opts.width * 1000))); }
    function gy(y) { return Math.max(0, Math.min(1000, Math.round(y * zoom / opts.height * 1000))); }

    function emit(el, role, name, extras, vis, maxName) {
      var s = '[' + el.getAttribute('data-halo-id') + '] ' + role;
      if (name) s += ' ' + q(name, maxName || 80);
      if (extras.length) s += ' ' + extras.join(' ');
      s += ' @(' + gx((vis.l + vis.r) / 2) + ',' + gy((vis.t + vis.b) / 2) + ')';
      if (lines.length >= opts.maxLines || chars + s.length + 1 > opts.maxChars) { omitted++; return; }
      lines.push(s);
      chars += s.length + 1;
    }

    // Explicit stack (pre-order) so deep pages cannot overflow the JS stack.
    var stack = [{ el: document.body, clip: region }];
    while (stack.length) {
      var item = stack.pop();
      var el = item.el;
      if (!el || skipEl(el)) continue;
      var cs = getComputedStyle(el);
      if (cs.display === 'none' || cs.opacity === '0') continue;
      var clipRect = cs.position === 'fixed' ? region : item.clip;
      var r = el.getBoundingClientRect();
      var box = { l: r.left, t: r.top, r: r.right, b: r.bottom };
      var vis = inter(box, clipRect);
      var shown = !isEmpty(vis) && cs.visibility === 'visible' && el.getAttribute('aria-hidden') !== 'true';
      var tag = el.tagName.toUpperCase();
      var role = roleOf(el, tag);
      var descend = true;

      if (el.id === 'query') {
        if (shown) emit(el, 'text', fullText(el), [], vis, 400);
        descend = false;
      } else if (role !== null && CONSUME[role] === 1) {
        if (shown) emit(el, role, nameOf(el, role, tag), extrasOf(el, role, tag, cs), vis);
        descend = false;
      } else if (role === 'text') {
        if (shown && norm(el.textContent)) emit(el, 'text', norm(el.textContent), [], vis);
        descend = false;
      } else {
        var kind = contentKind(el);
        var own = ownText(el);
        // Mixed inline content (text with clickable spans) is read as one line, then its parts; a
        // container of inline elements without text of its own gets no line (its children speak).
        var text = kind === 'block' ? own : kind === 'inline' ? (role === null && !own ? '' : inlineText(el)) : fullText(el);
        // A role element around plain inline text (<th><span>Su</span></th>) is one line, not two.
        if (kind === 'simple' || (kind === 'inline' && role !== null && !el.querySelector(INTERACTIVE))) descend = false;
        if (shown && role === null && !text && !el.firstElementChild) {
          // Text-less leaves that still carry meaning: icons (CSS images) and coloured / bordered / clickable boxes.
          var leaf = leafGraphic(el, cs, vis);
          if (leaf) emit(el, leaf.role, leaf.name, leaf.extras, vis);
        } else if (shown && (role !== null || text)) {
          var name = role === null ? text : (el.getAttribute('aria-label') ? norm(el.getAttribute('aria-label')) : text);
          var extras = extrasOf(el, role === null ? 'text' : role, tag, cs);
          // Unnamed structure (tablist, menu, listitem around a link...) only matters when it has a state.
          if (name || extras.length > 0 || role === 'focusable') emit(el, role === null ? 'text' : role, name, extras, vis);
        }
      }
      if (!descend) continue;
      var childClip = clipRect;
      if (cs.overflowX !== 'visible' || cs.overflowY !== 'visible') childClip = inter(clipRect, box);
      for (var c = el.lastElementChild; c; c = c.previousElementSibling) stack.push({ el: c, clip: childClip });
    }
    if (omitted > 0) lines.push('\u2026 ' + omitted + ' more elements not shown');
    return lines.join('\n');
  }

  function state() {
    var f = window.__haloFinal;
    if (f) return { done: true, raw: f.raw, scaled: f.scaled, reason: f.reason };
    var raw = Number(window.WOB_RAW_REWARD_GLOBAL);
    var scaled = Number(window.WOB_REWARD_GLOBAL);
    var reason = window.WOB_REWARD_REASON;
    return {
      done: window.WOB_DONE_GLOBAL === true,
      raw: isFinite(raw) ? raw : 0,
      scaled: isFinite(scaled) ? scaled : 0,
      reason: reason === null || reason === undefined ? null : String(reason),
    };
  }

  function nextFrame() {
    return new Promise(function (resolve) {
      var finished = false;
      function fin() { if (!finished) { finished = true; resolve(); } }
      requestAnimationFrame(function () { setTimeout(fin, 0); });
      setTimeout(fin, 200);
    });
  }

  window.__halo = {
    // Seed, set the episode time limit and start the episode. Wraps core.endEpisode so that the first
    // result of the episode is kept even if something later starts another episode in the page.
    start: function (opts) {
      window.__haloFinal = null;
      // Wrapped once: a restarted page must not stack wrappers.
      var origEnd = window.__haloOrigEnd || (window.__haloOrigEnd = core.endEpisode);
      core.endEpisode = function (reward, timeProportional, reason) {
        var active = core.EP_TIMER !== null;
        var result = origEnd.apply(this, arguments);
        if (active && !window.__haloFinal && window.WOB_DONE_GLOBAL === true) {
          var raw = Number(window.WOB_RAW_REWARD_GLOBAL);
          var scaled = Number(window.WOB_REWARD_GLOBAL);
          var why = window.WOB_REWARD_REASON;
          window.__haloFinal = { raw: isFinite(raw) ? raw : 0, scaled: isFinite(scaled) ? scaled : 0, reason: why === null || why === undefined ? null : String(why) };
        }
        return result;
      };
      Math.seedrandom(opts.seed);
      // null keeps the task's own limit (the official setting).
      if (opts.maxTimeMs !== null) core.EPISODE_MAX_TIME = opts.maxTimeMs;
      core.startEpisodeReal();
      return true;
    },
    // Whether start() can run again on this page (core loaded, its START cover made, seedrandom there).
    restartable: function () {
      return typeof core !== 'undefined' && core.cover_div != null && typeof Math.seedrandom === 'function' && typeof genProblem === 'function';
    },
    // A new episode on the loaded page, the way MiniWoB's own Python environment goes from one episode to the
    // next: a running episode is stopped (its force_stop), then seed and startEpisodeReal. What the previous
    // episode left outside the task's DOM (focus, scroll, element ids) is put back as a fresh page has it.
    restart: function (opts) {
      if (core.EP_TIMER !== null) core.endEpisode(0, false, 'reset');
      var active = document.activeElement;
      if (active && active !== document.body && typeof active.blur === 'function') active.blur();
      var sel = window.getSelection && window.getSelection();
      if (sel) sel.removeAllRanges();
      resetIds();
      window.scrollTo(0, 0);
      return window.__halo.start(opts);
    },
    utterance: function () {
      var u = core.getUtterance();
      if (u && typeof u === 'object') u = u.utterance;
      return norm(u);
    },
    assignIds: assignIds,
    axtree: axtree,
    state: state,
    afterAction: function () {
      return nextFrame().then(function () { assignIds(); return state(); });
    },
    afterActionNow: function () {
      assignIds();
      return state();
    },
    view: function (opts) {
      var vv = window.visualViewport;
      return {
        axtree: axtree(opts),
        scrollX: vv ? vv.pageLeft : window.scrollX,
        scrollY: vv ? vv.pageTop : window.scrollY,
      };
    },
  };
  return true;
})()`;
