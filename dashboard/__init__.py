"""The interactive dashboard: one page over the pool's lifecycle (collection, representation, curation,
optimization, consumption) and the JSON routes it polls. Mount ``clawr1.dashboard.api.dashboard_router``."""
