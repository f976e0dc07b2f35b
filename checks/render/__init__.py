"""Renderers over one result list: terminal table, JUnit XML (JSON lives in report.py)."""
