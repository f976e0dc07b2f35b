"""Imported by forkrun's --preload in a test: leaves a thread running, as a careless module
imported before the fork would."""

import threading
import time

threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
