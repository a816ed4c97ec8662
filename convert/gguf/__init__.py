"""The contract layer convert/ and runtime/ both stand on: what a GGUF file of ours says and
whether a drafter and a target can work together, read from headers alone.

- :mod:`.keys` — every drafter GGUF key and arch name (SPEC §5a);
- :mod:`.header` — the GGUF header reader (metadata only; a truncated file is one error line);
- :mod:`.rules` — the range rules of every value llama.cpp reads (the loader, ``inspect``, the fuzz test);
- :mod:`.pairing` — the pair rules (layers, hidden size, vocabulary, mask token);
- :mod:`.specs` — one type per model, :class:`~.specs.TargetSpec` and :class:`~.specs.DrafterSpec`,
  read and range-checked from a header, and ``check_pair``.

- :mod:`.errors` — the errors every layer raises (``UserError``; ``ContractError``: file, field,
  expected, found; convert/errors.py names them for the layers above).

It imports nothing from the rest of the package (tests/test_structure.py holds it to that;
docs/architecture.md has the layers): it stays under convert/ only because the package's
folders are convert/ and runtime/.
"""
