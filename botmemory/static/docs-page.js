// Swagger UI of the REST API on our own assets (a file, not an inline script: the page's CSP
// allows scripts of this origin only). validatorUrl null keeps it from calling out.
window.ui = SwaggerUIBundle({ url: "/openapi.json", dom_id: "#swagger-ui", validatorUrl: null });
