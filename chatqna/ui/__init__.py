"""The chat UI's static files: plain HTML, CSS and JavaScript modules, with no build step.

`chatqna.api.ui` serves `index.html` at `/` and the other files at `/ui/<name>`. The modules
are `app.js` (wiring and conversation state), `api.js` (requests and the API key),
`sse.js` (the event-stream parser) and `render.js` (the DOM for turns, sources and the
retrieval report).
"""
