"""Pure capacity arithmetic: model architecture → KV layout → memory budget → blocks →
capacity and ceilings, as vLLM computes them release by release. No I/O here."""
