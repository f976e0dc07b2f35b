"""Check modules; each registers its checks with @check on import."""
