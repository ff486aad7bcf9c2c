"""elastic-ray's Slurm lab (labctl/, run by ``integration/lab``), the fault matrix (faults/) and
the tests that need the lab.

A package, so that its modules import one another the way the rest of the repository imports
``tests.helpers``: by their name from the repository root (``from integration import labctl``),
which pytest puts on ``sys.path`` for a test module inside a package, and which is the working
directory of ``python -m integration.faults``. Importing it starts nothing.
"""
