"""Population based training with tray.tune: a class trainable whose best
learning rate drifts during training, so no fixed rate wins — PBT copies the
weights of the trials doing well (exploit) and perturbs their learning rate
(explore), following the optimum as it moves.

    python examples/pbt.py [--sim]

With ``--sim`` it runs on a simulated cluster: the same population, the same
exploits and the same best trial every run.
"""

import argparse
import tempfile
import time

import tray
from tray import tune
from tray.tune.schedulers import PopulationBasedTraining


class DriftingOptimum(tune.Trainable):
    """Accuracy grows fastest when ``lr`` is near an optimum that decays with
    the iteration (a stand-in for a real learning-rate schedule)."""

    def setup(self, config):
        self.lr = config["lr"]
        self.accuracy = 0.0

    def step(self):
        time.sleep(0.05)  # one "epoch" (virtual time under --sim)
        optimum = 0.1 / (1 + self.iteration / 10)
        closeness = max(0.0, 1.0 - abs(self.lr - optimum) / optimum)
        self.accuracy += 0.1 * closeness * (1.0 - self.accuracy)
        return {"mean_accuracy": self.accuracy, "lr": self.lr,
                "done": self.iteration + 1 >= 60}

    def save_checkpoint(self, checkpoint_dir):
        return {"accuracy": self.accuracy, "lr": self.lr}

    def load_checkpoint(self, checkpoint):
        self.accuracy = checkpoint["accuracy"]  # the weights; lr comes from the config

    def reset_config(self, new_config):
        self.lr = new_config["lr"]
        self.config = new_config
        return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sim", action="store_true", help="run on a simulated cluster")
    parser.add_argument("--population", type=int, default=8)
    args = parser.parse_args()
    if args.sim:
        tray.init(backend="sim", num_cpus=4, seed=3)
    else:
        tray.init()

    pbt = PopulationBasedTraining(
        time_attr="training_iteration", perturbation_interval=5,
        hyperparam_mutations={"lr": tune.loguniform(1e-3, 0.3)})
    tuner = tune.Tuner(
        DriftingOptimum,
        param_space={"lr": tune.loguniform(1e-3, 0.3)},
        tune_config=tune.TuneConfig(metric="mean_accuracy", mode="max", scheduler=pbt,
                                    num_samples=args.population, reuse_actors=True),
        run_config=tune.RunConfig(
            name="pbt", storage_path=tempfile.mkdtemp(prefix="tray-tune-"), verbose=0,
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=5, num_to_keep=4)))
    results = tuner.fit()
    best = results.get_best_result()
    print(f"best mean_accuracy {best.metrics['mean_accuracy']:.3f} "
          f"(final lr {best.config['lr']:.4f})")
    history = best.metrics_dataframe
    print("the best trial's lr over time:",
          [round(v, 4) for v in history["lr"].iloc[::10].tolist()])
    print(f"{len(results)} trials, {results.num_errors} errors")
    tray.shutdown()


if __name__ == "__main__":
    main()
