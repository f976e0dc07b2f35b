"""The report model both sides use: loading and checking host reports (load), the figures they
carry (figures), the fleet aggregate over them (aggregate) with its stragglers, findings, digest
groups, NVL72 domains and fabric summary, and the SVG charts of the HTML report. The node side
reads it to draw a host as a fleet of one; the controller (checks.fleet) builds on it."""
