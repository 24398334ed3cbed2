"""One completion, start to end: document -> language -> prompt -> decode -> trim -> event.

`complete` is the whole pipeline and runs on the decode worker thread; the LSP layer (server/lsp.py)
only schedules it, cancels it and turns its result into protocol items. Nothing here knows LSP.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from speccomplete.decoder.backends import TextDecoder
from speccomplete.decoder.drafts import draft_label
from speccomplete.decoder.engine import DecodeOptions, Generation, SpeculativeDecoder
from speccomplete.decoder.gamma import parse_gamma_policy
from speccomplete.decoder.loader import load_decoder
from speccomplete.decoder.models import Progress, packaged_gguf
from speccomplete.decoder.sampling import SamplingParams
from speccomplete.decoder.stats import GenerationStats
from speccomplete.telemetry.events import CompletionEvent, Outcome, Stage, Trigger

from . import gate
from .closers import closers_after, retypes
from .filters import TrimContext, scope_closed, stop_strings, trim_with_cause
from .gate import Evidence
from .language import detect_language
from .options import ServerOptions
from .positions import PositionError, offset_at, utf16_len
from .prompt import FimTokens, Prompt, TokenIds, build_prompt, fim_stop_ids, fim_tokens, format_fim
from .snippets import OpenDocument

log = logging.getLogger(__name__)


@dataclass
class Engine:
    """The loaded backend, and what telemetry calls it."""

    decoder: TextDecoder  # SpeculativeDecoder for the local backend
    target: str
    draft: str
    device: str
    fim: FimTokens | None  # the target's fill-in-the-middle tokens; None: prompt with the prefix only
    backend: str = "local"
    # the ids a FIM prompt's decode stops at (prompt.fim_stop_ids); the other backends stop by themselves
    fim_stops: frozenset[int] = frozenset()
    quantization: str = "none"  # the local target's linear weights (decoder/loader.py)
    # the local target's tokenizer: the gate counts the tokens behind the shown text with it; other backends: None
    tokenizer: PreTrainedTokenizerBase | None = None


def load_engine(options: ServerOptions, progress: Progress | None = None) -> Engine:
    """Load the backend's models; slow (seconds to minutes), so never on the event loop. `progress`
    hears how a first run's model conversion goes (decoder/models.py, convert_gguf)."""
    if options.backend == "llamacpp":
        from speccomplete.decoder.backends.llamacpp import GGUFVocabulary, LlamaCppDecoder

        gguf = options.gguf or str(packaged_gguf(options.target))
        llama = LlamaCppDecoder(gguf, speculative=options.llamacpp_speculative)
        draft = "none" if options.llamacpp_speculative == "none" else f"llama.cpp {options.llamacpp_speculative}"
        return Engine(
            llama, gguf, draft, f"cpu llama.cpp {llama.threads} threads", fim_tokens(GGUFVocabulary(gguf)), "llamacpp"
        )
    if options.backend == "openai":
        from speccomplete.decoder.backends.openai_compatible import OpenAICompletionsDecoder

        remote = OpenAICompletionsDecoder(options.openai_url, options.openai_model, options.openai_api_key_env)
        # the server's model and drafting are its own business: prompt with the prefix only (no FIM tokens known)
        return Engine(remote, options.openai_model or "", "unknown", options.openai_url, None, "openai")
    loaded = load_decoder(
        options.target,
        options.draft,
        device=options.device,
        dtype=options.dtype,
        gamma=options.gamma,
        draft_confidence=options.draft_confidence,
        tree_nodes=options.draft_tree_nodes,
        quantization=options.quantization,
        progress=progress,
    )
    decoder = loaded.decoder
    target, tokenizer = loaded.target, loaded.tokenizer
    weights = "int8" if loaded.quantization == "int8" else str(target.dtype).removeprefix("torch.")
    device = f"{target.device} {weights}"
    vocab = TokenIds(tokenizer)
    fim = fim_tokens(vocab)
    stops = fim_stop_ids(fim, vocab) if fim else frozenset()
    return Engine(
        decoder,
        options.target,
        draft_label(options.draft, target),
        device,
        fim,
        fim_stops=stops,
        quantization=loaded.quantization,
        tokenizer=tokenizer,
    )


def retune(engine: Engine, options: ServerOptions) -> Engine:
    """The same models with a new γ policy, draft confidence and draft tree (no reload); other backends have none."""
    old = engine.decoder
    if not isinstance(old, SpeculativeDecoder):
        return engine
    gamma = parse_gamma_policy(options.gamma)
    decoder = SpeculativeDecoder(
        old.target,
        old.tokenizer,
        old.drafter,
        gamma if old.drafter else None,
        draft_confidence=options.draft_confidence,
        steps=old.steps,
        tree_nodes=options.draft_tree_nodes,
    )
    return dataclasses.replace(engine, decoder=decoder)


@dataclass
class Request:
    request_id: str
    text: str
    path: str  # from the document URI; used for language detection only
    language_id: str | None
    line: int
    character: int  # UTF-16 code units, as LSP counts
    trigger: Trigger
    received: float  # time.perf_counter() when the server took the request up (after any debounce)
    open_documents: tuple[OpenDocument, ...] = ()  # the editor's other open documents, most recent first
    continues_block: bool = False  # the user accepted the first lines of a block here: decode its next lines
    debounce_ms: float = 0.0  # how long the server waited for more typing before taking it up


@dataclass
class Completion:
    text: str  # what to insert at the cursor; "" for no completion
    language: str
    multiline: bool
    event: CompletionEvent  # its empty_reason says why text is ""
    error: Exception | None = None  # bad input the client should hear about (e.g. a position past the end)
    evidence: Evidence | None = None  # how sure the target was of it (server/gate.py); None where not decoded
    replaces: int = 0  # characters after the cursor that the text retypes and replaces (closers; server/closers.py)
    more: bool = False  # a block's lines so far, answered at its time budget: accepting them asks for the next


def complete(engine: Engine, options: ServerOptions, request: Request, cancel: threading.Event) -> Completion:
    language = detect_language(request.path, request.language_id, request.text)

    def finish(
        text: str,
        multiline: bool,
        stats: GenerationStats,
        reason: str | None,
        error: Exception | None = None,
        found: Evidence | None = None,
        replaces: int = 0,
        more: bool = False,
    ) -> Completion:
        outcome: Outcome = "shown" if text else "error" if error else "cancelled" if reason == "cancelled" else "empty"
        stage: Stage | None = "continued" if request.continues_block else "first" if more and text else None
        event = _event(engine, options, request, language, multiline, stats, outcome, text, reason, stage)
        return Completion(text, language, multiline, event, error, found, replaces if text else 0, more and bool(text))

    text = request.text
    if len(text) > options.max_document_chars:
        log.warning(
            "%s: %d characters is over maxDocumentChars=%d; no completion",
            request.path,
            len(text),
            options.max_document_chars,
        )
        return finish("", False, GenerationStats(), "too-large")
    if "\0" in text:
        log.warning("%s: binary content (NUL bytes); no completion", request.path)
        return finish("", False, GenerationStats(), "binary")
    if not options.language_enabled(language):
        log.info("%s: %s is not in enabledLanguages; no completion", request.path, language)
        return finish("", False, GenerationStats(), "language-off")
    try:
        offset = offset_at(text, request.line, request.character)
    except PositionError as e:
        log.warning("%s: %s", request.path, e)
        return finish("", False, GenerationStats(), "error", error=e)

    try:
        prompt, closers, document = _prompt_at(options, request, language, offset)

        def below(multiline: bool) -> Answer:
            """What goes on the next line, as after Enter."""
            after_enter = build_prompt(
                document[:offset] + "\n" + document[offset:],
                offset + 1,
                language,
                options.prompt_budget_chars,
                request.open_documents,
                options.context_budget_chars,
            )
            answer = _answer(
                engine, options, request, dataclasses.replace(after_enter, multiline=multiline), "", cancel
            )
            answer.text = "\n" + answer.text if answer.text else ""
            return answer

        if request.continues_block:  # the user took a block's first lines, ending here: its next lines
            prompt = dataclasses.replace(prompt, multiline=True)
            answer = below(multiline=True)
        else:
            answer = _answer(engine, options, request, prompt, closers, cancel)
            if answer.reason == "finished-line":  # the model ended the line: offer the next one below it
                answer = below(multiline=False)
    except Exception as e:  # a bug or out-of-memory in one completion must not take the server down
        log.exception("%s: completion failed", request.path)
        return finish("", False, GenerationStats(), "error", error=e)
    stats = answer.generation.stats  # the decode whose answer is shown; the event's latency covers both
    return finish(
        answer.text,
        prompt.multiline,
        stats,
        answer.reason,
        found=answer.found,
        replaces=answer.replaces,
        more=answer.more,
    )


def warm(engine: Engine, options: ServerOptions, request: Request, cancel: threading.Event) -> int:
    """Read the prompt a completion at `request`'s position would read, and decode nothing: the server calls
    it at the first edit in a document whose prompt the model has not read, so that the request at the next
    pause prefills only what changed since. Returns the prompt tokens the cache holds (0: nothing to warm)."""
    decoder = engine.decoder
    language = detect_language(request.path, request.language_id, request.text)
    text = request.text
    if (
        not isinstance(decoder, SpeculativeDecoder)  # the other backends keep their own caches
        or len(text) > options.max_document_chars
        or "\0" in text
        or not options.language_enabled(language)
    ):
        return 0
    try:
        prompt, _, _ = _prompt_at(options, request, language, offset_at(text, request.line, request.character))
        return decoder.warm(_model_input(engine, prompt), _decode_options(engine, options, prompt, cancel, None))
    except Exception:  # it only saves time: a failure costs the next request its prefill, nothing more
        log.exception("%s: reading the prompt ahead failed", request.path)
        return 0


def _prompt_at(options: ServerOptions, request: Request, language: str, offset: int) -> tuple[Prompt, str, str]:
    """The prompt at `offset`, the closers after the cursor, and the document without them (auto-closed
    brackets and quotes: the prompt leaves them out, and the completion retypes them)."""
    text = request.text
    closers = closers_after(text, offset)
    document = text[:offset] + text[offset + len(closers) :]
    prompt = build_prompt(
        document, offset, language, options.prompt_budget_chars, request.open_documents, options.context_budget_chars
    )
    return prompt, closers, document


def _model_input(engine: Engine, prompt: Prompt) -> str:
    return format_fim(prompt, engine.fim) if engine.fim else prompt.model_prefix


@dataclass
class BlockBudget:
    """Ends a block's decode at the first round past `deadline` (time.perf_counter()) that has a whole line
    of code written, so that the block is answered with its lines so far (`blockBudgetMs`)."""

    deadline: float
    hit: bool = False

    def __call__(self, text: str) -> bool:
        if time.perf_counter() >= self.deadline:
            self.hit = any(line.strip() for line in text.split("\n")[:-1])
        return self.hit


def _decode_options(
    engine: Engine, options: ServerOptions, prompt: Prompt, cancel: threading.Event, budget: BlockBudget | None
) -> DecodeOptions:
    context = TrimContext.from_prompt(prompt)
    closed = scope_closed(context)
    return DecodeOptions(
        max_new_tokens=options.max_tokens_multi_line if prompt.multiline else options.max_tokens_single_line,
        sampling=SamplingParams(temperature=options.temperature),
        stop_strings=stop_strings(prompt.language, prompt.multiline),
        stop_tokens=engine.fim_stops,
        stop_when=closed if budget is None else lambda text: closed(text) or budget(text),
        cancel=cancel,
        gamma_group=prompt.language,  # γ adapts to each language's own acceptance
        heal=options.token_healing,
    )


@dataclass
class Answer:
    """What one decode gives, trimmed and gated: the text to show, or "" and why."""

    text: str
    reason: str | None
    replaces: int
    generation: Generation
    found: Evidence | None = None
    more: bool = False  # cut at the block budget: the decode had more to say


def _answer(
    engine: Engine, options: ServerOptions, request: Request, prompt: Prompt, closers: str, cancel: threading.Event
) -> Answer:
    """Decode the prompt, trim the completion (retyping `closers` if it can) and gate it."""
    context = TrimContext.from_prompt(prompt)
    budget = None
    if prompt.multiline and options.block_budget_ms:
        budget = BlockBudget(request.received + options.block_budget_ms / 1000)
    generation = engine.decoder.generate(
        _model_input(engine, prompt), _decode_options(engine, options, prompt, cancel, budget)
    )
    if generation.finish_reason == "cancelled":
        return Answer("", "cancelled", 0, generation)
    written = generation.text
    more = budget is not None and budget.hit and generation.finish_reason == "predicate"
    if more:  # the lines so far, never a line cut short
        written = written[: written.rfind("\n")]
        generation.stats.finish_reason = "budget"
    completion, reason = trim_with_cause(written, context)
    replaces = len(closers)
    if closers and not retypes(completion, closers):  # inserted before the closers: trim against them
        completion, reason = trim_with_cause(written, dataclasses.replace(context, suffix=closers + context.suffix))
        replaces = 0
    if replaces and completion.strip() == closers:  # it only retypes what is there
        completion, reason = "", "no-text"
    if not written.strip():
        finished_line = (
            generation.finish_reason == "stop"
            and not prompt.multiline
            and not closers
            and not context.rest_of_line.strip()
        )
        reason = "finished-line" if finished_line else "no-text"
    found = gate.evidence(generation, completion, engine.tokenizer)
    if completion and gate.silenced(found, options.min_confidence):
        log.info(
            "%s: not shown, first line's confidence %.2f < minConfidence %.2f",
            request.path,
            found.first_line_confidence,
            options.min_confidence,
        )
        completion, reason = "", "gate"
    # cut by the budget, and by nothing after: a filter that cut it ended the block for good
    more = more and completion == written.rstrip()
    return Answer(completion, reason, replaces if completion else 0, generation, found, more)


def cancelled(engine: Engine, options: ServerOptions, request: Request) -> Completion:
    """A request cancelled before it reached the decoder (the user typed on during the debounce)."""
    language = detect_language(request.path, request.language_id, request.text)
    stats = GenerationStats()
    return Completion(
        "", language, False, _event(engine, options, request, language, False, stats, "cancelled", "", "cancelled")
    )


def reuse(engine: Engine, options: ServerOptions, request: Request, previous: Completion, rest: str) -> Completion:
    """Serve the rest of an earlier completion the user is typing along (server/outcomes.py's `typed_along`):
    no decoding."""
    stats = GenerationStats(finish_reason="reused")
    event = _event(engine, options, request, previous.language, previous.multiline, stats, "shown", rest)
    language, multiline = previous.language, previous.multiline
    return Completion(rest, language, multiline, event, replaces=previous.replaces, more=previous.more)


def next_lines_request(request: Request, shown: Completion) -> Request:
    """The request a staged block's first lines lead to once the user takes them: the document with them
    inserted, the cursor at their end, asking for the block's next lines (the LSP layer decodes it ahead)."""
    offset = offset_at(request.text, request.line, request.character)
    before = request.text[:offset] + shown.text
    return dataclasses.replace(
        request,
        request_id=uuid.uuid4().hex,
        text=before + request.text[offset + shown.replaces :],
        line=before.count("\n"),
        character=utf16_len(before[before.rfind("\n") + 1 :]),
        received=time.perf_counter(),
        continues_block=True,
    )


def served_ahead(request: Request, ahead: Completion) -> Completion:
    """The next lines decoded ahead for `request`, which asked where they begin: its event is this request's
    (its id, trigger and wait), its decode statistics the ahead decode's."""
    event = dataclasses.replace(
        ahead.event,
        request_id=request.request_id,
        trigger=request.trigger,
        latency_ms=(time.perf_counter() - request.received) * 1000,
    )
    return dataclasses.replace(ahead, event=event)


def _event(
    engine: Engine,
    options: ServerOptions,
    request: Request,
    language: str,
    multiline: bool,
    stats: GenerationStats,
    outcome: Outcome,
    text: str,
    empty_reason: str | None = None,
    stage: Stage | None = None,
) -> CompletionEvent:
    return CompletionEvent.from_stats(
        stats.to_dict(),
        request_id=request.request_id,
        language=language,
        trigger=request.trigger,
        multiline=multiline,
        latency_ms=(time.perf_counter() - request.received) * 1000,
        target=engine.target,
        draft=engine.draft,
        device=engine.device,
        backend=engine.backend,
        settings=options.settings(),
        outcome=outcome,
        empty_reason=None if text else empty_reason,
        stage=stage,
        debounce_ms=request.debounce_ms,
        source=options.telemetry_source,
        text=text if options.telemetry_text and text else None,
    )
