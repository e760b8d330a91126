"""clustersim: a discrete-event simulator of GPU clusters training large language models.

Data flow (docs/architecture.md): scenario YAML -> ``sim.spec.scenario.load_scenario`` -> ``Scenario`` ->
``sim.workload.build.build`` -> ``TaskGraph`` -> ``sim.engine.event.simulate`` -> trace DataFrame -> ``sim.output.summary.summarize``.
``sim.runner.run`` does all of it in memory; ``sim.cli.commands`` is the command line.
"""

__version__ = "0.1.0"
