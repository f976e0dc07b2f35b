"""Imported by forkrun's --preload in a test: the ranks find it already in sys.modules."""
