"""Black-box capture: a mitmproxy-based proxy that records agent <-> LLM calls as raw_llm_call events.

runner (processes and modes) -> addons (mitmproxy hooks) -> record (events) -> emitter + spool (Kafka);
apis/ holds one pure parser per recognised LLM API. See docs/proxy.md.
"""
