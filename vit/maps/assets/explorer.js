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
  if (!pre) clsButton.textContent = "pooled query (mean of patches)";
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
