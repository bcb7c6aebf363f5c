"""The web layer: FastAPI routes that translate engine events into HTML fragments and JSON."""
