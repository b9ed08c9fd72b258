// The chattts-serve page: type text, hear it while it is made; make voices from clips.
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

// mp3 through Media Source Extensions: bytes are appended as they arrive, the element plays
// as soon as it has enough.
class MsePlayer {
  constructor(audio) {
    this.audio = audio;
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

  seconds() { return Number.isFinite(this.audio.duration) ? this.audio.duration : null; }
  stop() { this.audio.pause(); }
}

// wav / pcm (s16le mono 24 kHz) through Web Audio: each chunk is scheduled right after the last.
// ``timeline`` gets the first audio's time and, at each chunk, how much has played so far.
class PcmPlayer {
  constructor(skipBytes, timeline) {
    this.ctx = new AudioContext({ sampleRate: SAMPLE_RATE });
    this.skip = skipBytes;
    this.carry = new Uint8Array(0);
    this.at = 0;
    this.first = null; // the context time the first buffer starts at
    this.samples = 0;
    this.sources = [];
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
    if (!whole) return;
    const ints = new Int16Array(data.buffer.slice(data.byteOffset, data.byteOffset + whole));
    const buffer = this.ctx.createBuffer(1, ints.length, SAMPLE_RATE);
    const out = buffer.getChannelData(0);
    for (let i = 0; i < ints.length; i++) out[i] = ints[i] / 32768;
    const src = this.ctx.createBufferSource();
    src.buffer = buffer;
    src.connect(this.ctx.destination);
    const now = this.ctx.currentTime;
    const start = Math.max(this.at, now + 0.05);
    src.start(start);
    if (this.first === null) {
      this.first = start;
      this.timeline.firstAudio = performance.now() + (start - now) * 1000;
    } else if (now > this.first) {
      this.timeline.plays.push([performance.now(), now - this.first]); // the graph is playing samples
    }
    this.sources.push(src);
    this.at = start + buffer.duration;
    this.samples += ints.length;
  }

  end() {}
  seconds() { return this.samples / SAMPLE_RATE; }
  stop() { this.sources.forEach((s) => { try { s.stop(); } catch (_) { /* not started */ } }); this.ctx.close(); }
}

// Other formats: played once complete.
class FilePlayer {
  constructor(audio, type) { this.audio = audio; this.type = type; this.parts = []; }
  push(bytes) { this.parts.push(bytes); }
  end() { this.audio.src = URL.createObjectURL(new Blob(this.parts, { type: this.type })); this.audio.play().catch(() => {}); }
  seconds() { return Number.isFinite(this.audio.duration) ? this.audio.duration : null; }
  stop() { this.audio.pause(); }
}

function concat(parts) {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) { out.set(p, at); at += p.length; }
  return out;
}

// ------------------------------------------------------------------ speaking

let current = null; // { controller, player }

function requestBody() {
  const body = {
    model: "chattts",
    input: $("text").value,
    voice: voiceValue(),
    response_format: $("format").value,
    speed: Number($("speed").value),
    temperature: Number($("temperature").value),
    top_p: Number($("top-p").value),
    top_k: Number($("top-k").value),
  };
  const seed = $("seed").value.trim();
  if (seed !== "") body.seed = Number(seed);
  const prompt = $("prompt").value.trim();
  if (prompt) body.prompt = prompt;
  return body;
}

function voiceValue() {
  const opt = $("voice").selectedOptions[0];
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
  const body = requestBody();
  const fmt = body.response_format;
  const audio = $("player");
  const t = { start: performance.now(), firstByte: null, firstAudio: null, responseEnd: null, audioSeconds: null,
              chunks: 0, bytes: 0, format: fmt, plays: [], events: [], arrivals: [], error: null };
  window.ttsTimeline = t;
  showStats(t);
  $("download").hidden = true;

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
  try {
    const resp = await api("audio/speech", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
      signal: controller.signal,
    });
    const reader = resp.body.getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      if (t.firstByte == null) t.firstByte = performance.now();
      t.chunks += 1;
      t.bytes += value.length;
      t.arrivals.push([performance.now(), value.length]);
      parts.push(value);
      player.push(value);
      showStats(t);
    }
    t.responseEnd = performance.now();
    player.end();
    const blob = new Blob(parts, { type: CONTENT_TYPES[fmt] });
    const link = $("download");
    link.href = URL.createObjectURL(blob);
    link.download = `speech.${fmt}`;
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

// ------------------------------------------------------------------ voices

async function loadVoices(select) {
  const list = $("voice-list");
  let voices;
  try {
    voices = (await (await api("audio/voices")).json()).data;
  } catch (err) {
    showError(err);
    return;
  }
  const picker = $("voice");
  const keep = select || picker.value || "alloy";
  picker.replaceChildren();
  const builtin = document.createElement("optgroup");
  builtin.label = "Built-in";
  const custom = document.createElement("optgroup");
  custom.label = "Your voices";
  list.replaceChildren();
  for (const v of voices) {
    const opt = new Option(v.kind === "builtin" ? v.name : `${v.name} (${v.kind})`, v.id);
    if (v.kind !== "builtin") {
      opt.dataset.custom = "1";
      custom.append(opt);
      list.append(voiceItem(v));
    } else {
      builtin.append(opt);
    }
  }
  picker.append(builtin);
  if (custom.children.length) picker.append(custom);
  else list.innerHTML = '<li class="empty">No custom voices yet.</li>';
  picker.value = keep;
  if (!picker.value) picker.value = "alloy";
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
$("stop").addEventListener("click", () => { stop(); $("speak").disabled = false; $("stop").disabled = true; });
$("record").addEventListener("click", toggleRecording);
$("voice-form").addEventListener("submit", createVoice);
loadVoices();
