"""Learning to play Pong (Ray 0.1 docs, "Learning to Play Pong"): Andrej
Karpathy's policy-gradient network in numpy, with games played in parallel
by actors.

Each ``PongEnv`` actor holds an Atari Pong emulator (gymnasium's
``ALE/Pong-v5`` from ``ale-py``, which ships the ROM). The driver puts the
model in the object store once per batch; every actor plays a game with it
and returns the game's gradient and score; the driver sums the gradients
and takes an RMSProp step. Learning Pong takes hours; the defaults play a
few short games to show the loop (``--games``, ``--max-steps``).

    python examples/rl_pong.py [--sim] [--workers 2] [--batches 2] [--max-steps 300]
"""

import argparse

import numpy as np

import tray

HIDDEN = 200
INPUT = 80 * 80
GAMMA = 0.99
LEARNING_RATE = 1e-4
DECAY = 0.99
UP, DOWN = 2, 3


def preprocess(frame):
    """210x160x3 uint8 frame -> 6400 float vector (Karpathy's preprocessing)."""
    frame = frame[35:195][::2, ::2, 0].astype(np.float32)  # crop, downsample, one channel
    frame[frame == 144] = 0  # erase background (type 1)
    frame[frame == 109] = 0  # erase background (type 2)
    frame[frame != 0] = 1  # paddles and ball
    return frame.ravel()


def discount_rewards(rewards):
    """Discounted returns, reset at each point scored (Pong's game boundary)."""
    out = np.zeros_like(rewards)
    running = 0.0
    for t in reversed(range(len(rewards))):
        if rewards[t] != 0:
            running = 0.0
        running = running * GAMMA + rewards[t]
        out[t] = running
    return out


def policy_forward(model, x):
    hidden = np.maximum(model["W1"] @ x, 0.0)
    logit = model["W2"] @ hidden
    return 1.0 / (1.0 + np.exp(-logit)), hidden


@tray.remote
class PongEnv:
    def __init__(self, seed: int):
        # Numpy in many processes: one thread each, or they fight for cores.
        import os

        os.environ["OMP_NUM_THREADS"] = "1"
        import ale_py
        import gymnasium

        gymnasium.register_envs(ale_py)
        self.env = gymnasium.make("ALE/Pong-v5", repeat_action_probability=0.0)
        self.env.reset(seed=seed)
        self.rng = np.random.default_rng(seed)

    def compute_gradient(self, model, max_steps: int):
        """Play one game (up to ``max_steps``); return its gradient and score."""
        observation, _ = self.env.reset()
        previous = None
        xs, hiddens, dlogps, rewards = [], [], [], []
        for _ in range(max_steps):
            current = preprocess(observation)
            x = current - previous if previous is not None else np.zeros(INPUT, np.float32)
            previous = current
            probability, hidden = policy_forward(model, x)
            action = UP if self.rng.random() < probability else DOWN
            xs.append(x)
            hiddens.append(hidden)
            dlogps.append((1.0 if action == UP else 0.0) - probability)  # d logp / d logit
            observation, reward, terminated, truncated, _ = self.env.step(action)
            rewards.append(reward)
            if terminated or truncated:
                break
        advantages = discount_rewards(np.array(rewards, dtype=np.float64))
        if advantages.std() > 0:
            advantages = (advantages - advantages.mean()) / advantages.std()
        dlogp = np.array(dlogps) * advantages
        hs, stacked = np.array(hiddens), np.array(xs)
        dW2 = hs.T @ dlogp
        dh = np.outer(dlogp, model["W2"])
        dh[hs <= 0] = 0.0
        dW1 = dh.T @ stacked
        return {"W1": dW1, "W2": dW2}, float(sum(rewards)), len(rewards)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sim", action="store_true", help="run on a simulated cluster")
    parser.add_argument("--workers", type=int, default=2, help="games played at once")
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=300, help="steps per game at most")
    args = parser.parse_args()
    tray.init(backend="sim", seed=0, num_cpus=4) if args.sim else tray.init()

    rng = np.random.default_rng(0)
    model = {"W1": rng.standard_normal((HIDDEN, INPUT)) / np.sqrt(INPUT),
             "W2": rng.standard_normal(HIDDEN) / np.sqrt(HIDDEN)}
    cache = {k: np.zeros_like(v) for k, v in model.items()}
    actors = [PongEnv.remote(seed) for seed in range(args.workers)]
    for batch in range(args.batches):
        model_ref = tray.put(model)  # one copy in the object store for all games
        results = tray.get([a.compute_gradient.remote(model_ref, args.max_steps)
                            for a in actors])
        for name in model:  # RMSProp ascent on the summed gradient
            gradient = sum(g[name] for g, _, _ in results)
            cache[name] = DECAY * cache[name] + (1 - DECAY) * gradient ** 2
            model[name] = model[name] + LEARNING_RATE * gradient / (np.sqrt(cache[name]) + 1e-5)
        scores = [score for _, score, _ in results]
        steps = sum(length for _, _, length in results)
        print(f"batch {batch}: {len(results)} games, {steps} frames, scores {scores}")
    tray.shutdown()


if __name__ == "__main__":
    main()
