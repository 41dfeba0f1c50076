"""The on-disk index: layout (format), record encoding (records), reader and writer."""
