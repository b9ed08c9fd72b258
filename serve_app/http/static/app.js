// The chattts-serve page: type text, SSML or a dialogue, hear it while it is made with its captions;
// make voices from clips.
// No build step and no dependencies. Talks to the same server's API (relative URLs, so the page
// works under any route prefix) with the API key kept in localStorage.
"use strict";

const $ = (id) => document.getElementById(id);
const API = new URL("../v1/", document.baseURI);
const SAMPLE_RATE = 24000;
const WAV_HEADER_BYTES = 44; // the server's streamed WAV header (sizes unknown up front)
const CONTENT_TYPES = {
  mp3: "audio/mpeg", wav: "audio/wav", pcm: "audio/pcm", opus: "audio/ogg", aac: "audio/aac", flac: "audio/flac",
};

// What the last synthesis did, in performance.now() milliseconds (also read by the browser tests).
window.ttsTimeline = null;

// ------------------------------------------------------------------ API

function authHeaders() {
  const key = $("api-key").value.trim();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

class ApiError extends Error {
  constructor(status, body) {
    const err = (body && body.error) || {};
    super(err.message || `HTTP ${status}`);
    this.status = status;
    this.code = err.code || null;
    this.param = err.param || null;
  }
}

async function readError(resp) {
  let body = null;
  try { body = await resp.json(); } catch (_) { /* not JSON */ }
  return new ApiError(resp.status, body);
}

async function api(path, options = {}) {
  const resp = await fetch(new URL(path, API), {
    ...options, headers: { ...authHeaders(), ...(options.headers || {}) },
  });
  if (!resp.ok) throw await readError(resp);
  return resp;
}

function showError(err) {
  const box = $("error");
  if (!err) { box.hidden = true; box.textContent = ""; return; }
  let text = err.message || String(err);
  if (err instanceof ApiError) {
    const where = err.param ? ` · ${err.param}` : "";
    text = `${err.message}\n(HTTP ${err.status}${err.code ? ` · ${err.code}` : ""}${where})`;
    if (err.status === 401) text += "\nEnter an API key at the top of the page.";
  }
  box.textContent = text;
  box.hidden = false;
}

// ------------------------------------------------------------------ players
// Each player takes the audio bytes as they arrive; position() is where playback is now (seconds
// into the audio, null before it starts), seek(s) plays from there.

// An <audio> element's clock and seeking (MSE and whole-file playback).
class ElementPlayer {
  constructor(audio) { this.audio = audio; }
  position() { return this.audio.currentTime > 0 || !this.audio.paused ? this.audio.currentTime : null; }
  seek(s) {
    const b = this.audio.buffered;
    if (!b.length || s > b.end(b.length - 1)) return false;
    this.audio.currentTime = s;
    this.audio.play().catch(() => {});
    return true;
  }
  seconds() { return Number.isFinite(this.audio.duration) ? this.audio.duration : null; }
  stop() { this.audio.pause(); }
}

// mp3 through Media Source Extensions: bytes are appended as they arrive, the element plays
// as soon as it has enough.
class MsePlayer extends ElementPlayer {
  constructor(audio) {
    super(audio);
    this.queue = [];
    this.ended = false;
    this.source = new MediaSource();
    this.sb = null;
    audio.src = URL.createObjectURL(this.source);
    this.source.addEventListener("sourceopen", () => {
      this.sb = this.source.addSourceBuffer("audio/mpeg");
      this.sb.mode = "sequence";
      this.sb.addEventListener("updateend", () => this.pump());
      this.pump();
    }, { once: true });
  }

  static supported() { return "MediaSource" in window && MediaSource.isTypeSupported("audio/mpeg"); }

  push(bytes) { this.queue.push(bytes); this.pump(); }

  end() { this.ended = true; this.pump(); }

  pump() {
    if (!this.sb || this.sb.updating) return;
    if (this.queue.length) {
      const next = concat(this.queue);
      this.queue = [];
      this.sb.appendBuffer(next);
    } else if (this.ended && this.source.readyState === "open") {
      this.source.endOfStream();
    }
  }
}

// Other formats: played once complete.
class FilePlayer extends ElementPlayer {
  constructor(audio, type) { super(audio); this.type = type; this.parts = []; }
  push(bytes) { this.parts.push(bytes); }
  end() { this.audio.src = URL.createObjectURL(new Blob(this.parts, { type: this.type })); this.audio.play().catch(() => {}); }
}

// wav / pcm (s16le mono 24 kHz) through Web Audio: each chunk is scheduled right after the last.
// ``timeline`` gets the first audio's time and, at each chunk, how much has played so far.
// ``plan`` maps the context's clock to the audio: [context time, audio offset, seconds] per
// scheduled buffer (a late chunk leaves a gap, a seek starts a new plan).
class PcmPlayer {
  constructor(skipBytes, timeline) {
    this.ctx = new AudioContext({ sampleRate: SAMPLE_RATE });
    this.skip = skipBytes;
    this.carry = new Uint8Array(0);
    this.at = 0;
    this.first = null; // the context time the first buffer starts at
    this.samples = 0;
    this.buffers = []; // [audio offset, AudioBuffer]: kept for seeking
    this.sources = [];
    this.plan = [];
    this.timeline = timeline;
  }

  push(bytes) {
    let data = bytes;
    if (this.skip > 0) {
      const n = Math.min(this.skip, data.length);
      this.skip -= n;
      data = data.subarray(n);
    }
    data = concat([this.carry, data]);
    const whole = data.length - (data.length % 2);
    this.carry = data.slice(whole);
    if (!whole || this.ctx.state === "closed") return;
    const ints = new Int16Array(data.buffer.slice(data.byteOffset, data.byteOffset + whole));
    const buffer = this.ctx.createBuffer(1, ints.length, SAMPLE_RATE);
    const out = buffer.getChannelData(0);
    for (let i = 0; i < ints.length; i++) out[i] = ints[i] / 32768;
    const offset = this.samples / SAMPLE_RATE;
    this.buffers.push([offset, buffer]);
    this.samples += ints.length;
    const now = this.ctx.currentTime;
    const start = this.schedule(buffer, offset, 0);
    if (this.first === null) {
      this.first = start;
      this.timeline.firstAudio = performance.now() + (start - now) * 1000;
    } else if (now > this.first) {
      this.timeline.plays.push([performance.now(), this.position()]); // the graph is playing samples
    }
  }

  // Plays ``buffer`` (at ``offset`` in the audio) from ``skip`` seconds into it, after what is scheduled.
  schedule(buffer, offset, skip) {
    const src = this.ctx.createBufferSource();
    src.buffer = buffer;
    src.connect(this.ctx.destination);
    const start = Math.max(this.at, this.ctx.currentTime + 0.05);
    src.start(start, skip);
    this.sources.push(src);
    this.plan.push([start, offset + skip, buffer.duration - skip]);
    this.at = start + buffer.duration - skip;
    return start;
  }

  position() {
    if (this.first === null || this.ctx.state === "closed") return null;
    const now = this.ctx.currentTime;
    let pos = null;
    for (const [at, offset, secs] of this.plan) {
      if (at > now) break;
      pos = offset + Math.min(now - at, secs);
    }
    return pos ?? (this.plan.length ? this.plan[0][1] : null);
  }

  seek(s) {
    if (this.ctx.state === "closed" || !this.buffers.length) return false;
    this.sources.forEach((src) => { try { src.stop(); } catch (_) { /* not started */ } });
    this.sources = [];
    this.plan = [];
    this.at = 0;
    for (const [offset, buffer] of this.buffers) {
      if (offset + buffer.duration > s) this.schedule(buffer, offset, Math.max(0, s - offset));
    }
    return true;
  }

  end() {}
  seconds() { return this.samples / SAMPLE_RATE; }
  stop() {
    this.sources.forEach((s) => { try { s.stop(); } catch (_) { /* not started */ } });
    if (this.ctx.state !== "closed") this.ctx.close();
  }
}

function concat(parts) {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) { out.set(p, at); at += p.length; }
  return out;
}

function fromBase64(text) {
  const bin = atob(text);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

// The events of a text/event-stream response (each "data:" payload parsed as JSON), as they arrive.
async function* sseEvents(resp, onBytes) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  let from = 0; // where to look for the next event's end (the text before it has none)
  for (;;) {
    const { done, value } = await reader.read();
    if (value) { onBytes(value.length); buf += decoder.decode(value, { stream: true }); }
    let cut;
    while ((cut = buf.indexOf("\n\n", from)) >= 0) {
      const data = buf.slice(0, cut).split("\n").filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(l.startsWith("data: ") ? 6 : 5)).join("\n");
      buf = buf.slice(cut + 2);
      from = 0;
      if (data) yield JSON.parse(data);
    }
    from = Math.max(0, buf.length - 1);
    if (done) return;
  }
}

// ------------------------------------------------------------------ captions
// One line per speech.segment event: its time in the audio, its speaker (a dialogue's voice or
// an SSML <voice>), its caption (the server's: control tags dropped). The line being heard is
// highlighted from the player's position. The caption file comes whole from the server, in the
// stream's last event (made as the with-timestamps answer's).

let voiceNames = {}; // voice id -> its name, for the speakers of custom voices

function speakerName(seg) { return seg.speaker ? (voiceNames[seg.speaker] || seg.speaker) : null; }

function fmtClock(s) {
  const m = Math.floor(s / 60);
  return `${m}:${(s - m * 60).toFixed(2).padStart(5, "0")}`;
}

function resetCaptions() {
  $("captions").replaceChildren();
  $("captions-box").hidden = true;
  const link = $("captions-file");
  if (link.href) URL.revokeObjectURL(link.href);
  link.removeAttribute("href");
  link.hidden = true;
}

function addCaption(seg, speakers) {
  const li = document.createElement("li");
  li.dataset.index = seg.index;
  li.tabIndex = 0;
  li.title = "Play from here";
  const when = document.createElement("span");
  when.className = "when";
  when.textContent = `${fmtClock(seg.start)}–${fmtClock(seg.end)}`;
  li.append(when);
  const name = speakerName(seg);
  if (name) {
    if (!(name in speakers)) speakers[name] = Object.keys(speakers).length % 4;
    const who = document.createElement("span");
    who.className = `who spk-${speakers[name]}`;
    who.textContent = name;
    li.append(who);
  }
  const say = document.createElement("span");
  say.className = "say";
  say.textContent = seg.caption || "…";
  li.append(say);
  $("captions").append(li);
  $("captions-box").hidden = false;
}

const CAPTION_TYPES = { vtt: "text/vtt", srt: "application/x-subrip" };

function offerCaptions(done, stem) {
  if (!done || !done.captions) return;
  const format = done.captions_format;
  const link = $("captions-file");
  link.href = URL.createObjectURL(new Blob([done.captions], { type: CAPTION_TYPES[format] }));
  link.download = `${stem}.${format}`;
  link.textContent = `Download captions (.${format})`;
  link.hidden = false;
}

// The segment at the player's position (none in a pause between segments), highlighted.
function followPlayback() {
  const t = window.ttsTimeline;
  if (!current || !t) return;
  const pos = current.player.position();
  let index = null;
  if (pos != null) {
    const seg = t.segments.find((s) => s.start <= pos && pos < s.end);
    if (seg) index = seg.index;
  }
  if (index === t.highlighted) return;
  t.highlighted = index;
  t.highlights.push([performance.now(), index, pos]);
  const list = $("captions");
  for (const li of list.querySelectorAll("li.current")) { li.classList.remove("current"); li.removeAttribute("aria-current"); }
  const li = index == null ? null : list.querySelector(`li[data-index="${index}"]`);
  if (li) {
    li.classList.add("current");
    li.setAttribute("aria-current", "true");
    // Keep it in view inside the list (not by scrolling the page).
    if (li.offsetTop < list.scrollTop || li.offsetTop + li.offsetHeight > list.scrollTop + list.clientHeight) {
      list.scrollTop = li.offsetTop - list.clientHeight / 3;
    }
  }
}
setInterval(followPlayback, 50);

function seekTo(li) {
  const t = window.ttsTimeline;
  if (!current || !t || !li) return;
  const seg = t.segments.find((s) => String(s.index) === li.dataset.index);
  if (seg && current.player.seek) current.player.seek(seg.start);
}

// ------------------------------------------------------------------ speaking

let current = null; // { controller, player }

const SSML_EXAMPLE = `<speak>
  <p>你好，欢迎收听。<break time="700ms"/>今天的节目现在开始。</p>
  <s><prosody rate="slow">This sentence is spoken slowly.</prosody></s>
  <voice name="echo">我是另一个声音，电话是<say-as interpret-as="telephone">12345</say-as>。</voice>
  <s>It is <say-as interpret-as="cardinal">42</say-as> past <say-as interpret-as="characters">ten</say-as>.</s>
</speak>`;

function mode() { return document.querySelector('input[name="mode"]:checked').value; }
function looksLikeSsml(text) { return /^\s*(<\?xml[^>]*>\s*)?<speak[\s>]/.test(text); }

// The options every request shares (OpenAI's fields and ChatTTS's extras).
function commonBody() {
  const body = {
    model: "chattts",
    response_format: $("format").value,
    speed: Number($("speed").value),
    temperature: Number($("temperature").value),
    top_p: Number($("top-p").value),
    top_k: Number($("top-k").value),
    stream_format: "sse",
    timestamps: true,
    captions: $("captions-format").value,
  };
  const seed = $("seed").value.trim();
  if (seed !== "") body.seed = Number(seed);
  const prompt = $("prompt").value.trim();
  if (prompt) body.prompt = prompt;
  const volume = Number($("volume").value);
  if (volume) body.volume = volume;
  const instructions = $("instructions").value.trim();
  if (instructions) body.instructions = instructions;
  return body;
}

// [API path, body] of what the page is set to speak.
function request() {
  const body = commonBody();
  if (mode() === "dialogue") {
    body.turns = [...$("turns").children].map((li) => ({
      voice: voiceValue(li.querySelector("select")), input: li.querySelector("textarea").value,
    }));
    body.pause_s = Number($("pause").value);
    return ["audio/dialogue", body];
  }
  body.input = $("text").value;
  body.voice = voiceValue($("voice"));
  body.input_format = $("ssml").checked ? "ssml" : "text";
  return ["audio/speech", body];
}

function voiceValue(select) {
  const opt = select.selectedOptions[0];
  if (!opt) return "alloy";
  return opt.dataset.custom ? { id: opt.value } : opt.value; // OpenAI's custom voice shape
}

function fmtMs(ms) { return ms == null ? "–" : ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(2)} s`; }

function showStats(t) {
  $("stat-ttfb").textContent = fmtMs(t.firstByte != null ? t.firstByte - t.start : null);
  $("stat-first-audio").textContent = fmtMs(t.firstAudio != null ? t.firstAudio - t.start : null);
  $("stat-audio").textContent = t.audioSeconds != null ? `${t.audioSeconds.toFixed(2)} s` : "–";
  $("stat-total").textContent = fmtMs(t.responseEnd != null ? t.responseEnd - t.start : null);
  const rtf = t.audioSeconds ? (t.responseEnd - t.start) / 1000 / t.audioSeconds : null;
  $("stat-rtf").textContent = rtf != null ? rtf.toFixed(2) : "–";
}

async function speak() {
  stop();
  showError(null);
  const [path, body] = request();
  const fmt = body.response_format;
  const stem = path === "audio/dialogue" ? "dialogue" : "speech";
  const audio = $("player");
  // firstByte: the response's first bytes; chunks/bytes: the audio's (the SSE framing aside).
  const t = { start: performance.now(), firstByte: null, firstAudio: null, responseEnd: null, audioSeconds: null,
              chunks: 0, bytes: 0, format: fmt, plays: [], events: [], arrivals: [], error: null,
              segments: [], segmentArrivals: [], highlighted: null, highlights: [], done: null };
  window.ttsTimeline = t;
  showStats(t);
  $("download").hidden = true;
  resetCaptions();

  audio.pause();
  audio.removeAttribute("src"); // the last synthesis's audio must not count as this one's
  audio.load();
  let player;
  if (fmt === "mp3" && MsePlayer.supported()) player = new MsePlayer(audio);
  else if (fmt === "wav" || fmt === "pcm") player = new PcmPlayer(fmt === "wav" ? WAV_HEADER_BYTES : 0, t);
  else player = new FilePlayer(audio, CONTENT_TYPES[fmt]);
  t.element = !(player instanceof PcmPlayer); // played by the <audio> element (its clock counts)
  if (player instanceof MsePlayer) {
    // Started inside the click (autoplay rules); it begins once enough audio is buffered.
    audio.play().catch(() => {});
  }
  const controller = new AbortController();
  current = { controller, player };
  $("speak").disabled = true;
  $("stop").disabled = false;

  const parts = [];
  const speakers = {}; // speaker name -> colour
  try {
    const resp = await api(path, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
      signal: controller.signal,
    });
    const onBytes = () => { if (t.firstByte == null) t.firstByte = performance.now(); };
    for await (const event of sseEvents(resp, onBytes)) {
      if (event.type === "speech.audio.delta") {
        const value = fromBase64(event.audio);
        t.chunks += 1;
        t.bytes += value.length;
        t.arrivals.push([performance.now(), value.length]);
        parts.push(value);
        player.push(value);
        showStats(t);
      } else if (event.type === "speech.segment") {
        t.segments.push(event);
        t.segmentArrivals.push(performance.now());
        addCaption(event, speakers);
      } else if (event.type === "speech.audio.done") {
        t.done = event;
      } else if (event.type === "error") {
        throw new ApiError(500, event);
      }
    }
    t.responseEnd = performance.now();
    player.end();
    const blob = new Blob(parts, { type: CONTENT_TYPES[fmt] });
    const link = $("download");
    link.href = URL.createObjectURL(blob);
    link.download = `${stem}.${fmt}`;
    link.textContent = `Download ${fmt} (${(blob.size / 1024).toFixed(0)} KiB)`;
    link.hidden = false;
    t.audioSeconds = player.seconds();
    if (t.audioSeconds == null) {
      audio.addEventListener("durationchange", () => {
        if (Number.isFinite(audio.duration)) { t.audioSeconds = audio.duration; showStats(t); }
      }, { once: false });
    }
  } catch (err) {
    if (err.name !== "AbortError") { t.error = err.message; showError(err); }
    player.stop();
  } finally {
    offerCaptions(t.done, stem);
    showStats(t);
    $("speak").disabled = false;
    $("stop").disabled = true;
  }
}

function stop() {
  if (!current) return;
  current.controller.abort();
  current.player.stop();
  current = null;
}

// The media element's state changes, with the time they happened (stalls show up as "waiting").
for (const type of ["canplay", "playing", "waiting", "ended"]) {
  $("player").addEventListener(type, () => { if (window.ttsTimeline) window.ttsTimeline.events.push([performance.now(), type]); });
}

// The media element's clock, for the first-audio time and for the tests' proof of streaming.
$("player").addEventListener("timeupdate", () => {
  const t = window.ttsTimeline;
  const audio = $("player");
  if (!t || !t.element || audio.currentTime <= 0) return;
  const now = performance.now();
  t.plays.push([now, audio.currentTime]);
  if (t.firstAudio == null) { t.firstAudio = now - audio.currentTime * 1000; showStats(t); }
});

// ------------------------------------------------------------------ dialogue

const DEFAULT_TURNS = [
  ["alloy", "Hello, and welcome to the show. Today we talk about speech."],
  ["echo", "谢谢，很高兴来到这里。我们开始吧。"],
];

function addTurn(voice, text) {
  const li = document.createElement("li");
  const select = document.createElement("select");
  select.setAttribute("aria-label", "Voice of this turn");
  fillVoices(select, voice);
  const box = document.createElement("textarea");
  box.rows = 2;
  box.maxLength = 4096;
  box.value = text || "";
  box.setAttribute("aria-label", "What this turn says");
  const del = document.createElement("button");
  del.type = "button";
  del.className = "delete";
  del.textContent = "Remove";
  del.title = "Remove this turn";
  del.addEventListener("click", () => { li.remove(); renumberTurns(); });
  li.append(select, box, del);
  $("turns").append(li);
  renumberTurns();
  return li;
}

function renumberTurns() {
  const turns = [...$("turns").children];
  turns.forEach((li) => { li.querySelector("button.delete").disabled = turns.length <= 1; });
}

function setMode(value) {
  const dialogue = value === "dialogue";
  $("text-mode").hidden = dialogue;
  $("dialogue-mode").hidden = !dialogue;
  $("ssml-tools").hidden = dialogue;
  $("voice-field").hidden = dialogue; // each turn has its voice
}

// ------------------------------------------------------------------ voices

let voiceList = []; // GET audio/voices' data

// The voice picker's options (built-in, then the caller's), keeping ``keep`` selected if it is there.
function fillVoices(picker, keep) {
  picker.replaceChildren();
  const builtin = document.createElement("optgroup");
  builtin.label = "Built-in";
  const custom = document.createElement("optgroup");
  custom.label = "Your voices";
  for (const v of voiceList) {
    const opt = new Option(v.kind === "builtin" ? v.name : `${v.name} (${v.kind})`, v.id);
    if (v.kind !== "builtin") {
      opt.dataset.custom = "1";
      custom.append(opt);
    } else {
      builtin.append(opt);
    }
  }
  if (!voiceList.length) builtin.append(new Option(keep || "alloy", keep || "alloy"));
  picker.append(builtin);
  if (custom.children.length) picker.append(custom);
  picker.value = keep;
  if (!picker.value) picker.value = "alloy";
}

async function loadVoices(select) {
  const list = $("voice-list");
  try {
    voiceList = (await (await api("audio/voices")).json()).data;
  } catch (err) {
    showError(err);
    return;
  }
  voiceNames = Object.fromEntries(voiceList.map((v) => [v.id, v.name]));
  fillVoices($("voice"), select || $("voice").value || "alloy");
  for (const turn of $("turns").querySelectorAll("select")) fillVoices(turn, turn.value || "alloy");
  list.replaceChildren();
  for (const v of voiceList) if (v.kind !== "builtin") list.append(voiceItem(v));
  if (!list.children.length) list.innerHTML = '<li class="empty">No custom voices yet.</li>';
}

function voiceItem(v) {
  const li = document.createElement("li");
  li.dataset.id = v.id;
  const name = document.createElement("span");
  name.className = "name";
  name.textContent = v.name;
  const kind = document.createElement("span");
  kind.className = "kind";
  kind.textContent = v.kind === "clip" ? `clip, ${v.clip_seconds} s` : v.kind === "seed" ? `seed ${v.seed}` : v.kind;
  const use = document.createElement("button");
  use.type = "button";
  use.textContent = "Use";
  use.addEventListener("click", () => { $("voice").value = v.id; });
  const del = document.createElement("button");
  del.type = "button";
  del.textContent = "Delete";
  del.className = "delete";
  del.addEventListener("click", async () => {
    if (!confirm(`Delete the voice “${v.name}”?`)) return;
    try {
      await api(`audio/voices/${encodeURIComponent(v.id)}`, { method: "DELETE" });
      await loadVoices();
    } catch (err) { showError(err); }
  });
  li.append(name, kind, use, del);
  return li;
}

let recorded = null; // a Blob from the microphone
let recorder = null;

async function toggleRecording() {
  const button = $("record");
  if (recorder) { recorder.stop(); return; }
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({ audio: true });
  } catch (err) {
    $("record-status").textContent = `microphone unavailable: ${err.message}`;
    return;
  }
  const chunks = [];
  const started = performance.now();
  recorder = new MediaRecorder(stream);
  recorder.addEventListener("dataavailable", (e) => { if (e.data.size) chunks.push(e.data); });
  recorder.addEventListener("stop", () => {
    stream.getTracks().forEach((tr) => tr.stop());
    recorded = new Blob(chunks, { type: recorder.mimeType || "audio/webm" });
    const secs = (performance.now() - started) / 1000;
    $("record-status").textContent = `recorded ${secs.toFixed(1)} s`;
    const preview = $("clip-preview");
    preview.src = URL.createObjectURL(recorded);
    preview.hidden = false;
    $("voice-file").value = "";
    button.textContent = "● Record";
    button.classList.remove("recording");
    recorder = null;
  });
  recorder.start(250);
  button.textContent = "■ Stop";
  button.classList.add("recording");
  $("record-status").textContent = "recording…";
}

async function createVoice(event) {
  event.preventDefault();
  showError(null);
  const status = $("voice-status");
  const form = new FormData();
  form.append("name", $("voice-name").value.trim());
  form.append("transcript", $("voice-transcript").value);
  // The consent the box states, and who gave it: the server keeps both with the voice.
  if ($("voice-consent").checked) {
    form.append("consent", $("voice-consent-text").textContent.replace(/\s+/g, " ").trim());
    form.append("consent_by", $("voice-consent-by").value.trim());
  }
  const file = $("voice-file").files[0];
  if (file) form.append("audio", file, file.name);
  else if (recorded) form.append("audio", recorded, "recording.webm");
  const button = $("create-voice");
  button.disabled = true;
  status.textContent = "Encoding the clip…";
  const t0 = performance.now();
  try {
    const voice = await (await api("audio/voices", { method: "POST", body: form })).json();
    const took = performance.now() - t0;
    $("voice-form").reset();
    recorded = null;
    $("clip-preview").hidden = true;
    $("record-status").textContent = "";
    await loadVoices(voice.id);
    status.textContent = `Created “${voice.name}” in ${fmtMs(took)}.`;
  } catch (err) {
    status.textContent = "";
    showError(err);
  } finally {
    button.disabled = false;
  }
}

// ------------------------------------------------------------------ wiring

function insertTag(tag) {
  const box = $("text");
  const at = box.selectionStart ?? box.value.length;
  box.setRangeText(tag, at, box.selectionEnd ?? at, "end");
  box.focus();
}

$("api-key").value = localStorage.getItem("chattts-api-key") || "";
$("api-key").addEventListener("change", () => {
  localStorage.setItem("chattts-api-key", $("api-key").value.trim());
  loadVoices();
});
$("tags").addEventListener("click", (e) => { if (e.target.dataset.tag) insertTag(e.target.dataset.tag); });
$("speed").addEventListener("input", () => { $("speed-out").textContent = `${Number($("speed").value).toFixed(2)}×`; });
$("speak").addEventListener("click", speak);
$("ssml-example").addEventListener("click", () => {
  $("text").value = SSML_EXAMPLE;
  $("ssml").checked = true;
  $("text").focus();
});
let lookedLikeSsml = looksLikeSsml($("text").value);
$("text").addEventListener("input", () => {
  // Follows the text when it starts or stops looking like SSML; a click on the box overrides it.
  const now = looksLikeSsml($("text").value);
  if (now !== lookedLikeSsml) $("ssml").checked = now;
  lookedLikeSsml = now;
});
for (const radio of document.querySelectorAll('input[name="mode"]')) radio.addEventListener("change", () => setMode(mode()));
$("add-turn").addEventListener("click", () => {
  const turns = $("turns").querySelectorAll("select");
  const last = turns.length ? turns[turns.length - 1].value : "echo";
  addTurn(last === "alloy" ? "echo" : "alloy", "").querySelector("textarea").focus();
});
$("captions").addEventListener("click", (e) => seekTo(e.target.closest("li")));
$("captions").addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); seekTo(e.target.closest("li")); } });
$("stop").addEventListener("click", () => { stop(); $("speak").disabled = false; $("stop").disabled = true; });
$("record").addEventListener("click", toggleRecording);
$("voice-form").addEventListener("submit", createVoice);
for (const [voice, text] of DEFAULT_TURNS) addTurn(voice, text);
setMode(mode());
$("ssml").checked = lookedLikeSsml;
loadVoices();
