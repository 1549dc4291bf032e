"""The generated reference pages (``docs/generate.py``) and the status-page screenshot."""
