"""Every decoder-only class of the installed transformers against Jacobi decoding (issue 32)."""
