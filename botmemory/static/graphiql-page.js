// GraphiQL on our own assets: queries over HTTP, subscriptions over graphql-transport-ws with the
// header editor's headers as the connection_init payload.
(function () {
  "use strict";
  const url = new URL("/graphql", window.location.href);
  const ws = new URL(url);
  ws.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  const fetcher = GraphiQL.createFetcher({ url: url.toString(), subscriptionUrl: ws.toString() });
  const root = ReactDOM.createRoot(document.getElementById("graphiql"));
  root.render(
    React.createElement(GraphiQL, {
      fetcher: fetcher,
      defaultQuery: "# A person token in Headers, then run:\n{\n  me {\n    id\n    name\n  }\n}\n",
      defaultHeaders: JSON.stringify({ Authorization: "Bearer " }, null, 2),
      defaultEditorToolsVisibility: "headers",
      isHeadersEditorEnabled: true,
      shouldPersistHeaders: false,
      // GraphiQL keeps each run's headers in its history whatever shouldPersistHeaders says:
      // in this tab's sessionStorage (gone with the tab, as the explorer keeps its token), never
      // in localStorage, where the next person to open /graphql in this browser found the token.
      storage: window.sessionStorage,
    }),
  );
})();
