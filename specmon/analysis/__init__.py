"""What the stored data says: segment summaries of every source, losslessness, the watched sources' health."""
