"""Tools for the tests, benchmarks and docs, not the product (synthetic fleets of reports).
The wheel the nodes install leaves this package out, with checks.docgen (pyproject.toml)."""
