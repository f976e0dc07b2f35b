"""Tools for the tests, benchmarks, docs and `make`, not the product (synthetic fleets of reports,
the torch build `make verify` installs).
The wheel the nodes install leaves this package out, with checks.docgen (pyproject.toml)."""
