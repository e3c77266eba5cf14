"use strict";
// vit-explore's page script. It only selects and draws: every value shown was computed (and
// rounded to 4 decimals) by vit/commands/explore.py through vit.maps. Stored integers are value * scale.

async function inflate(base64) {
  // zlib-compressed uint16 as a plane of low bytes then one of high bytes (vit/commands/explore.py),
  // unpacked by the browser's own DecompressionStream
  const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
  const planes = new Uint8Array(await new Response(stream).arrayBuffer());
  const n = planes.length / 2, out = new Uint16Array(n);
  for (let i = 0; i < n; i++) out[i] = planes[i] | (planes[n + i] << 8);
  return out;
}

function el(tag, attrs = {}, text = "") {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text) node.textContent = text;
  return node;
}

async function main() {
  const meta = JSON.parse(document.getElementById("vit-data").textContent);
  const stored = await inflate(document.getElementById("vit-attention").textContent.trim());
  const [gh, gw] = meta.grid;
  const P = gh * gw, N = meta.tokens, H1 = meta.heads + 1, L = meta.depth, pre = meta.prefix;
  const pooledStart = meta.images.length * L * H1 * N * N;
  const CLS = pre ? 0 : "pooled"; // the query the pooled output makes (query_map in Python)
  const state = { image: 0, view: "attention", layer: L - 1, head: meta.heads, query: CLS, target: null };
  const fmt = (v) => v.toFixed(4);
  const set = (changes, imageChanged = false) => {
    Object.assign(state, changes);
    render(imageChanged);
  };
  const headName = (h) => (h === meta.heads ? "mean" : String(h));
  const patchName = (p) => `patch (${Math.floor(p / gw)}, ${p % gw})`;
  const queryName = (q) => (q === CLS ? (pre ? "the CLS token" : "the mean of the patch queries") : patchName(q - pre));

  function attentionRow(image, layer, head, query) {
    // {values over the P patch keys, cls: the CLS key's value or null}, from the stored integers
    const base = (image * L + layer) * H1 + head;
    if (query === "pooled") {
      const at = pooledStart + base * P;
      return { values: Array.from(stored.subarray(at, at + P), (q) => q / meta.scale), cls: null };
    }
    const at = (base * N + query) * N;
    const values = Array.from(stored.subarray(at + pre, at + N), (q) => q / meta.scale);
    return { values, cls: pre ? stored[at] / meta.scale : null };
  }

  function shown() {
    const img = meta.images[state.image];
    if (state.view === "rollout") return { values: img.rollout, cls: null };
    if (state.view === "grad") return { values: img.grad[state.target ?? img.pred], cls: null };
    return attentionRow(state.image, state.layer, state.head, state.query);
  }

  function drawHeat(canvas, values) {
    // darken each patch by how little it is attended, relative to the row's largest value
    canvas.width = gw;
    canvas.height = gh;
    const ctx = canvas.getContext("2d");
    const top = Math.max(...values) || 1;
    ctx.clearRect(0, 0, gw, gh);
    values.forEach((v, p) => {
      ctx.fillStyle = `rgba(0, 0, 0, ${(0.85 * (1 - v / top)).toFixed(3)})`;
      ctx.fillRect(p % gw, Math.floor(p / gw), 1, 1);
    });
  }

  // ---- build the controls once ---------------------------------------------------------
  const nav = document.getElementById("images");
  meta.images.forEach((img, i) => {
    const wrong = img.label !== null && img.label !== img.pred;
    const truth = img.label === null ? "" : `, true: ${meta.classes[img.label]}`;
    const button = el("button", {
      type: "button", "data-image": i, class: wrong ? "wrong" : "",
      title: `image ${i}: predicted ${meta.classes[img.pred]}${truth}`,
    });
    button.append(el("img", { src: img.src, alt: `image ${i}` }), el("span", {}, meta.classes[img.pred]));
    button.addEventListener("click", () => set({ image: i, target: null }, true));
    nav.append(button);
  });
  const layers = document.getElementById("layers");
  for (let l = 0; l < L; l++) {
    const b = el("button", { type: "button", "data-layer": l }, `layer ${l}`);
    b.addEventListener("click", () => set({ layer: l, view: "attention" }));
    layers.append(b);
  }
  const heads = document.getElementById("heads");
  for (let h = 0; h < H1; h++) {
    const b = el("button", { type: "button", "data-head": headName(h) }, h === meta.heads ? "mean of heads" : `head ${h}`);
    b.addEventListener("click", () => set({ head: h, view: "attention" }));
    heads.append(b);
  }
  document.querySelectorAll("#views button").forEach((b) =>
    b.addEventListener("click", () => set({ view: b.dataset.view })));
  const clsButton = document.getElementById("cls-query");
  clsButton.dataset.query = String(CLS);
  if (!pre) {
    clsButton.textContent = "pooled query (mean of patches)";
    document.getElementById("thumbs-hint").textContent = "(the pooled query: mean of patches; click)";
    document.getElementById("distance-keys").textContent = "no CLS token: every key is a patch";
  }
  clsButton.addEventListener("click", () => set({ query: CLS, view: "attention" }));

  const overlay = document.getElementById("overlay");
  overlay.style.gridTemplate = `repeat(${gh}, 1fr) / repeat(${gw}, 1fr)`;
  const hover = document.getElementById("hover-value");
  const cells = [];
  for (let p = 0; p < P; p++) {
    const cell = el("div", { class: "cell", "data-query": p + pre, "data-patch": p });
    cell.addEventListener("click", () => set({ query: p + pre, view: "attention" }));
    cell.addEventListener("mouseenter", () => { hover.textContent = `${patchName(p)}: ${cell.dataset.value}`; });
    overlay.append(cell);
    cells.push(cell);
  }

  const probs = document.getElementById("probs");
  meta.classes.forEach((name, k) => {
    const li = el("li", { "data-class": k });
    li.append(el("span", { class: "name" }, name), el("span", { class: "track" }), el("span", { class: "value" }));
    li.children[1].append(el("div", { class: "bar" }));
    li.addEventListener("click", () => set({ target: k, view: "grad" }));
    probs.append(li);
  });

  const thumbs = document.getElementById("thumbs");
  const head = thumbs.insertRow();
  head.append(el("th"));
  for (let h = 0; h < H1; h++) head.append(el("th", {}, h === meta.heads ? "mean" : `head ${h}`));
  const thumbCells = [];
  for (let l = 0; l < L; l++) {
    const row = thumbs.insertRow();
    row.append(el("th", {}, `layer ${l}`));
    for (let h = 0; h < H1; h++) {
      const div = el("div", { class: "thumb", "data-layer": l, "data-head": headName(h) });
      div.append(el("canvas"));
      div.addEventListener("click", () => set({ layer: l, head: h, query: CLS, view: "attention" }));
      row.insertCell().append(div);
      thumbCells.push({ div, l, h });
    }
  }
  // ---- the model as a whole: vit.maps.inspection's numbers, drawn ------------------------
  const whole = meta.whole;
  const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  function viridis(t) {
    // matplotlib's viridis through five of its colours: lightness rises, so greyscale keeps order
    const x = Math.min(Math.max(t, 0), 1) * (VIRIDIS.length - 1);
    const i = Math.min(Math.floor(x), VIRIDIS.length - 2), f = x - i;
    return VIRIDIS[i].map((c, k) => Math.round(c + f * (VIRIDIS[i + 1][k] - c)));
  }
  const svg = document.getElementById("distance");
  const dots = [];
  (function drawDistance() {
    const NS = svg.namespaceURI, W = 320, HT = 230, left = 48, right = 10, top = 8, bottom = 44;
    const px = whole.distance.pixels, uniform = whole.distance.uniform;
    const ymax = Math.max(uniform, ...px.flat()) * 1.15;
    const x = (l) => left + ((l + 0.5) * (W - left - right)) / L;
    const y = (v) => top + (1 - v / ymax) * (HT - top - bottom);
    const add = (tag, attrs, text) => {
      const node = document.createElementNS(NS, tag);
      for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
      if (text !== undefined) node.textContent = text;
      svg.append(node);
      return node;
    };
    const step = [1, 2, 5, 10, 20, 50].find((s) => ymax / s <= 6) || 100;
    for (let v = 0; v <= ymax; v += step) {
      add("line", { x1: left, x2: W - right, y1: y(v), y2: y(v), stroke: "#ddd" });
      add("text", { x: left - 4, y: y(v) + 4, "text-anchor": "end", class: "tick" }, String(v));
    }
    for (let l = 0; l < L; l++) add("text", { x: x(l), y: HT - bottom + 16, "text-anchor": "middle", class: "tick" }, String(l));
    add("text", { x: (left + W - right) / 2, y: HT - 6, "text-anchor": "middle" }, "layer (network depth)");
    add("text", { x: 12, y: (top + HT - bottom) / 2, "text-anchor": "middle",
      transform: `rotate(-90 12 ${(top + HT - bottom) / 2})` }, "mean attention distance (px)");
    add("line", { x1: left, x2: W - right, y1: y(uniform), y2: y(uniform), stroke: "#555",
      "stroke-dasharray": "5 4", class: "uniform", "data-value": uniform.toFixed(2) });
    const shapes = [
      (cx, cy) => ["circle", { cx, cy, r: 5 }],
      (cx, cy) => ["rect", { x: cx - 4.5, y: cy - 4.5, width: 9, height: 9 }],
      (cx, cy) => ["polygon", { points: `${cx},${cy - 6} ${cx - 5.5},${cy + 4} ${cx + 5.5},${cy + 4}` }],
    ];
    for (let l = 0; l < L; l++) {
      for (let h = 0; h < meta.heads; h++) {
        const cx = x(l) + (h - (meta.heads - 1) / 2) * Math.min(12, 60 / meta.heads), cy = y(px[l][h]);
        const [tag, attrs] = shapes[h % 3](cx, cy);
        const dot = add(tag, { ...attrs, class: "head-dot", "data-layer": l, "data-head": h,
          "data-value": px[l][h].toFixed(2), fill: Math.floor(h / 3) % 2 ? "#fff" : "#222", stroke: "#222" });
        const share = whole.distance.cls_share[l][h];
        dot.append(document.createElementNS(NS, "title"));
        dot.firstChild.textContent = `layer ${l}, head ${h}: ${px[l][h].toFixed(2)} px; weight on the CLS token ${fmt(share)}`;
        dot.addEventListener("click", () => set({ layer: l, head: h, view: "attention" }));
        dots.push(dot);
      }
    }
  })();

  const posCanvas = document.getElementById("positions");
  const simLow = Math.min(...whole.positions.flat());
  function drawPositions(p) {
    // position p's vector against every position's: cosine similarity, dark = the lowest
    const row = whole.positions[p];
    posCanvas.width = gw;
    posCanvas.height = gh;
    const ctx = posCanvas.getContext("2d");
    row.forEach((v, k) => {
      const [r, g, b] = viridis((v - simLow) / (1 - simLow || 1));
      ctx.fillStyle = `rgb(${r}, ${g}, ${b})`;
      ctx.fillRect(k % gw, Math.floor(k / gw), 1, 1);
    });
    posCanvas.dataset.position = p;
    posCanvas.dataset.values = JSON.stringify(row.map(fmt));
    document.getElementById("positions-caption").textContent =
      `What the position vectors learned: how alike the vector of ${patchName(p)} is to each ` +
      `patch's (cosine similarity; dark ${fmt(simLow)}, bright 1). Hover a patch of the image to choose.`;
  }
  drawPositions(Math.floor(gh / 2) * gw + Math.floor(gw / 2));
  cells.forEach((cell, p) => cell.addEventListener("mouseenter", () => drawPositions(p)));

  const filters = document.getElementById("filters");
  whole.filters.forEach((f, i) => {
    const item = el("div", { class: "filter", "data-ratio": f.ratio, title: `component ${i + 1}` });
    item.append(el("img", { src: f.src, alt: `filter component ${i + 1}` }), el("span", {}, `${(100 * f.ratio).toFixed(1)}%`));
    filters.append(item);
  });
  if (whole.shifts > 1) filters.classList.add("shifted");
  document.getElementById("filters-caption").textContent =
    `What the patch projection looks for: its ${whole.filters.length} leading principal ` +
    "components as RGB patches, each with the share of the filters' variance it explains" +
    (whole.shifts > 1 ? "; each shows the image, then its 4 copies shifted by half a patch (shifted patch tokenization)." : ".");

  document.getElementById("model-info").textContent =
    `${meta.images.length} images, ${L} layers x ${meta.heads} heads, ${gh}x${gw} patches; ` +
    `values rounded to 4 decimals; overlays darken the patches attended least`;

  // ---- draw the state ------------------------------------------------------------------
  function render(imageChanged = false) {
    const img = meta.images[state.image];
    const { values, cls } = shown();
    document.getElementById("image").src = img.src;
    drawHeat(document.getElementById("heat"), values);
    const texts = values.map(fmt);
    Object.assign(overlay.dataset, {
      image: state.image, view: state.view, layer: state.layer, head: headName(state.head),
      query: String(state.query), values: JSON.stringify(texts), cls: cls === null ? "" : fmt(cls),
    });
    cells.forEach((cell, p) => {
      cell.dataset.value = texts[p];
      cell.title = `${patchName(p)}: ${texts[p]}`;
      cell.classList.toggle("query", state.view === "attention" && state.query === p + pre);
    });
    const target = state.target ?? img.pred;
    document.getElementById("caption").textContent =
      state.view === "rollout" ? "attention rollout from the CLS token, all layers (largest = 1)"
      : state.view === "grad" ? `gradient rollout for class ${meta.classes[target]} (largest = 1)`
      : `layer ${state.layer}, head ${headName(state.head)}: where ${queryName(state.query)} looks` +
        (cls === null ? "" : `; to the CLS key: ${fmt(cls)}`);
    const selected = (node, on) => node.classList.toggle("selected", on);
    nav.querySelectorAll("button").forEach((b) => selected(b, +b.dataset.image === state.image));
    layers.querySelectorAll("button").forEach((b) => selected(b, +b.dataset.layer === state.layer));
    heads.querySelectorAll("button").forEach((b) => selected(b, b.dataset.head === headName(state.head)));
    document.querySelectorAll("#views button").forEach((b) => selected(b, b.dataset.view === state.view));
    selected(clsButton, state.view === "attention" && state.query === CLS);
    probs.querySelectorAll("li").forEach((li, k) => {
      li.className = [k === img.pred && "pred", k === img.label && "label", state.view === "grad" && k === target && "target"].filter(Boolean).join(" ");
      li.children[1].firstChild.style.width = `${100 * img.probs[k]}%`;
      li.children[2].textContent = fmt(img.probs[k]);
    });
    dots.forEach((d) => selected(d, state.view === "attention" && +d.dataset.layer === state.layer && +d.dataset.head === state.head));
    if (state.view === "attention" && state.query !== CLS) drawPositions(state.query - pre);
    for (const { div, l, h } of thumbCells) {
      selected(div, state.view === "attention" && l === state.layer && h === state.head);
      if (imageChanged) {
        div.style.backgroundImage = `url(${img.src})`;
        drawHeat(div.firstChild, attentionRow(state.image, l, h, CLS).values);
      }
    }
  }
  render(true);
  document.body.dataset.loadMs = performance.now().toFixed(0);
  document.body.dataset.ready = "1";
}

main().catch((err) => {
  document.body.dataset.error = String(err);
  document.getElementById("caption").textContent = `could not show the data: ${err}`;
});
