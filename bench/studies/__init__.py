"""Studies: measurements behind a code choice (``python -m bench numerics``, ``text-compare``)."""
