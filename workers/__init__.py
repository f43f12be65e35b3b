"""Worker entry points: settings → clients → activities → Temporal."""
