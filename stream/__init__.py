"""Fresh features: pushed events through an event log into the online store."""
