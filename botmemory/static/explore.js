// The memory explorer: only the public GraphQL API with the person's token (sessionStorage).
// Hidden neighbours are drawn only as a count (D9.7); "why" lists the caller's own atoms (D9.28).
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const ENTRY = "id layer content status sources { chat item entry }";
  const OPEN = `query($b: ID!, $id: ID!) { entry(botId: $b, id: $id) {
    entry { ${ENTRY} }
    sources(depth: 8) { entries { entry { ${ENTRY} } distance } items { chat item distance } hidden }
    dependents(depth: 8) { entries { entry { ${ENTRY} } distance } hidden }
    why { summary steps { entry chat item rule admittedBy reason } } } }`;
  const LIST = `query($b: ID!) { memory(botId: $b, limit: 100) { entries { ${ENTRY} } next } }`;
  const SEARCH = `query($b: ID!, $q: String!) { search(botId: $b, query: $q, limit: 50) { entry { ${ENTRY} } } }`;
  const BOTS = "{ bots { id name } }";
  let graph = null;

  for (const id of ["token", "bot"]) {
    $(id).value = sessionStorage.getItem("botmemory." + id) || "";
    $(id).addEventListener("change", () => sessionStorage.setItem("botmemory." + id, $(id).value.trim()));
  }

  // The Bots the token can use, offered as choices of the Bot field (the status line is the list's).
  async function bots() {
    $("bots").replaceChildren();
    if (!$("token").value.trim()) return;
    try {
      for (const b of (await gql(BOTS, {})).bots) {
        const option = document.createElement("option");
        option.value = b.id;
        option.label = b.name;
        $("bots").append(option);
      }
    } catch (err) {
      // A wrong token shows its error when the entries are asked for.
    }
  }
  $("token").addEventListener("change", bots);

  function status(text, error) {
    $("status").textContent = text;
    $("status").className = error ? "error" : "";
  }

  async function gql(query, variables) {
    const response = await fetch("/graphql", {
      method: "POST",
      headers: { "Content-Type": "application/json", Authorization: "Bearer " + $("token").value.trim() },
      body: JSON.stringify({ query, variables }),
    });
    let body;
    try {
      body = await response.json();
    } catch {
      throw new Error(`HTTP ${response.status}: the service did not answer in JSON`);
    }
    // Refused before GraphQL read it (too large, unreadable, the store away): the REST shape.
    if (body.error) throw new Error(`${body.error.code}: ${body.error.message}`);
    if (body.errors && body.errors.length) {
      const e = body.errors[0];
      throw new Error(((e.extensions && e.extensions.code) || "ERROR") + ": " + e.message);
    }
    return body.data;
  }

  const short = (text, n) => (text.length > n ? text.slice(0, n - 1) + "…" : text);

  // Only the latest request of each kind draws: two quick clicks listed the entries twice, and a
  // slow earlier answer drew over a later one.
  let listing = 0;
  let opening = 0;

  async function list() {
    const bot = $("bot").value.trim();
    const q = $("query").value.trim();
    const mine = ++listing;
    $("entries").replaceChildren();
    try {
      const data = q ? await gql(SEARCH, { b: bot, q }) : await gql(LIST, { b: bot });
      if (mine !== listing) return;
      const entries = q ? data.search.map((h) => h.entry) : data.memory.entries;
      for (const e of entries) {
        const li = document.createElement("li");
        li.dataset.id = e.id;
        const layer = document.createElement("span");
        layer.className = "layer";
        layer.textContent = e.layer;
        li.append(layer, short(e.content, 90));
        li.addEventListener("click", () => open(e.id));
        $("entries").append(li);
      }
      // The list holds the first 100 (the graph stays readable): say so when there are more.
      const more = !q && data.memory.next;
      status(
        !entries.length
          ? "No entries you may see."
          : more
            ? `The first ${entries.length} entries you may see; search, or open one by #id, for the others.`
            : `${entries.length} entries you may see.`,
        false,
      );
    } catch (err) {
      if (mine === listing) status(err.message, true);
    }
  }

  async function open(id) {
    for (const li of $("entries").children) li.classList.toggle("open", li.dataset.id === id);
    const mine = ++opening;
    try {
      const found = (await gql(OPEN, { b: $("bot").value.trim(), id })).entry;
      if (mine !== opening) return;
      draw(found);
      explain(found.why);
      status(`Entry ${id}`, false);
    } catch (err) {
      if (mine !== opening) return;
      if (graph) graph.destroy();
      graph = null;
      window.exploreGraph = null;
      $("summary").textContent = "Nothing to explain: you cannot see this entry.";
      $("steps").replaceChildren();
      status(err.message, true);
    }
  }

  function draw(found) {
    const nodes = new Map();
    const edges = [];
    const entry = (e, role) => {
      if (!nodes.has(e.id)) nodes.set(e.id, { data: { id: e.id, label: `${e.layer}: ${short(e.content, 40)}`, kind: role, entry: e } });
    };
    entry(found.entry, "root");
    found.sources.entries.forEach((n) => entry(n.entry, "source"));
    found.dependents.entries.forEach((n) => entry(n.entry, "dependent"));
    for (const item of found.sources.items) {
      const key = `item:${item.chat}/${item.item}`;
      nodes.set(key, { data: { id: key, label: `message ${item.item}\n${short(item.chat, 18)}`, kind: "item" } });
    }
    for (const { data } of [...nodes.values()]) {
      if (!data.entry) continue;
      for (const s of data.entry.sources) {
        const target = s.entry ? s.entry : `item:${s.chat}/${s.item}`;
        if (nodes.has(target)) edges.push({ data: { id: `${data.id}>${target}`, source: data.id, target } });
      }
    }
    const hidden = (count, side) => {
      if (!count) return;
      const key = `hidden:${side}`;
      nodes.set(key, { data: { id: key, label: `${count} hidden`, kind: "hidden" } });
      const pair = side === "sources" ? [found.entry.id, key] : [key, found.entry.id];
      edges.push({ data: { id: `${pair[0]}>${pair[1]}`, source: pair[0], target: pair[1] } });
    };
    hidden(found.sources.hidden, "sources");
    hidden(found.dependents.hidden, "dependents");
    if (graph) graph.destroy();
    graph = cytoscape({
      container: $("graph"),
      elements: [...nodes.values(), ...edges],
      layout: { name: "breadthfirst", directed: true, padding: 20, spacingFactor: 1.1 },
      style: [
        { selector: "node", style: { label: "data(label)", "text-wrap": "wrap", "text-max-width": 150, "font-size": 10,
          "text-valign": "bottom", "text-margin-y": 4, "background-color": "#7b8da6", width: 22, height: 22 } },
        { selector: "node[kind = 'root']", style: { "background-color": "#2457a6", width: 30, height: 30 } },
        { selector: "node[kind = 'dependent']", style: { "background-color": "#6a4fb3" } },
        { selector: "node[kind = 'item']", style: { shape: "round-rectangle", "background-color": "#3d9970" } },
        { selector: "node[kind = 'hidden']", style: { shape: "diamond", "background-color": "#b9bec7", color: "#555" } },
        { selector: "edge", style: { width: 1.5, "line-color": "#aab4c3", "target-arrow-shape": "triangle",
          "target-arrow-color": "#aab4c3", "curve-style": "bezier" } },
      ],
    });
    window.exploreGraph = graph;
  }

  function explain(why) {
    $("summary").textContent = why.summary;
    $("steps").replaceChildren(
      ...why.steps.map((s) => {
        const li = document.createElement("li");
        const rule = document.createElement("span");
        rule.className = "rule";
        rule.textContent = s.rule.replace("_", " ") + " ";
        const where = s.item ? ` — source message ${s.item} of entry ${short(s.entry, 14)}` : ` — entry ${short(s.entry, 14)}`;
        li.append(rule, s.reason, where);
        return li;
      }),
    );
  }

  bots();

  // /explore#<entry id> opens that entry after listing.
  $("go").addEventListener("click", async () => {
    for (const id of ["token", "bot"]) sessionStorage.setItem("botmemory." + id, $(id).value.trim());
    await list();
    let linked = "";
    try {
      linked = decodeURIComponent(window.location.hash.slice(1));
    } catch {
      linked = ""; // a malformed escape (#mem_%ZZ) opens nothing instead of failing the listing's click
    }
    if (linked) await open(linked);
  });
})();
