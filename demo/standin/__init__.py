"""The stand-in LLM engine tests and benches use in place of a real serving engine: ``server`` (the
HTTP app, its test hooks, TLS, ``main``), one module per API's wire shape (``chat``, ``completions``,
``responses``, ``messages``) and ``toy`` (tokenizer, chat template, replies, SSE) they share."""
