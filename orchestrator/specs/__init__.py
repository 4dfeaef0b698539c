"""What the user asked for, as pure values: hostfiles and node sets, the job environment,
recipes, and the constants every layer shares. No I/O beyond reading the user's files.
"""
