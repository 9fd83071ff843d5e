"""The CLI's commands that do more than print a reading: readback, switch, stop."""
