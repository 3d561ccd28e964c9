"""The agents' endpoint: what black-box agents (and agent programs in sandboxes) call instead of a hosted model.

- :mod:`.api`: :class:`~.api.OpenAIAPI`, ``POST /v1/chat/completions`` (tools, streaming, token continuity),
  ``GET /v1/models``, the session recorder (``/v1/relax/sessions``) and :meth:`~.api.OpenAIAPI.route`, which an
  HTTP server hands its ``/v1`` requests to;
- :mod:`.keys`: per-episode API keys and who a request speaks for; :mod:`.stream`: a completion as Server-Sent Events;
- :mod:`.openai_gateway`: :class:`~.openai_gateway.OpenAIGateway`, the API in front of the trainer's engine client
  (any engine, any process), recording every call for training;
- :mod:`.mount`: ``serve_with_agents(engine)``, the engine's own HTTP server with these routes on ``/v1``.

The gateway uses the engines (their protocol, HTTP server and errors); the engines never import it. Nothing is
imported here.
"""
