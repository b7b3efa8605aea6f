"""The Jacobi decoding core: verifiers, drafting, the ragged cache and the loop."""
