"""Renderers over one host report: terminal table, JUnit XML, HTML (a fleet of one) and Prometheus
textfile; the JSON report itself is built by checks/report_schema.py."""
