"""The communicator role: how each tensor travels (planner), hosts, and the state behind it."""
