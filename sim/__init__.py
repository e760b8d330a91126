"""clustersim: a discrete-event simulator of GPU clusters training large language models.

Data flow (docs/architecture.md): scenario YAML -> ``sim.config.load_scenario`` -> ``Scenario`` ->
``sim.workload.build`` -> ``TaskGraph`` -> ``sim.engine.simulate`` -> trace DataFrame -> ``sim.trace.summarize``.
``sim.runner.run`` does all of it in memory; ``sim.cli`` is the command line.
"""

__version__ = "0.1.0"
