"""The corpora and recordings that training and the bench read, one subcommand each."""

from tools.commands import Command, dispatch

COMMANDS = {
    "corpus": Command("tools.data.corpus", "make corpus: the synthetic training and held-out corpus"),
    "speech": Command("tools.data.speech", "make speech: training speech from neural voices and others, augmented"),
    "real": Command("tools.data.real_speech", "real recorded speech from packages, for evaluation (data/real)"),
    "long": Command("tools.data.long_audio", "one long recording from clips joined with pauses (data/long)"),
}

if __name__ == "__main__":
    dispatch("python -m tools.data", __doc__, COMMANDS)
