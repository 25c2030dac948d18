// The job page's output panel: the job's log, followed live, paused, per replica, downloaded.
//
// Markup (rendered by the server, no inline script):
//   <section data-job-log data-api="/api/v1/jobs/ID/logs/" data-ws="/ws/jobs/ID/logs/" data-live="1|0"
//            data-label-follow=… data-label-pause=… data-label-following=… data-label-paused=…
//            data-label-complete=… data-label-empty=… data-label-truncated=… data-label-error=…>
//     <select data-log-replica>  (only when the job has more than one replica)
//     <button data-log-toggle>   <a data-log-download>   <p data-log-status>   <pre data-log-text>
//   </section>
// A running job's log is followed over the WebSocket (the server pushes what the agent stores); when the socket
// cannot be used the API is asked every 2 s instead. A finished job's log is read through the API page by page.
// Every read is by byte offset (next_offset), so a reconnect misses nothing and repeats nothing.

const POLL_MS = 2000;
const MAX_SHOWN_CHARS = 2000000; // the panel keeps the newest 2 M characters; the download has everything kept
const SOCKET_ATTEMPTS = 3;

class JobLog {
  constructor(root) {
    this.root = root;
    this.labels = root.dataset;
    this.text = root.querySelector("[data-log-text]");
    this.status = root.querySelector("[data-log-status]");
    this.toggle = root.querySelector("[data-log-toggle]");
    this.select = root.querySelector("[data-log-replica]");
    this.download = root.querySelector("[data-log-download]");
    this.paused = false;
    this.generation = 0;
    this.toggle.addEventListener("click", () => this.setPaused(!this.paused));
    if (this.select) this.select.addEventListener("change", () => this.start(Number(this.select.value)));
    this.start(0);
  }

  start(replica) {
    this.generation += 1;
    this.replica = replica;
    this.offset = 0;
    this.pending = "";
    this.complete = false;
    this.truncatedNoted = false;
    this.socketFailures = 0;
    this.text.textContent = "";
    this.root.dataset.state = "loading";
    if (this.socket) this.socket.close();
    window.clearTimeout(this.timer);
    const download = new URL(this.download.href, window.location.href);
    download.searchParams.set("replica", String(replica));
    this.download.href = download.pathname + download.search;
    if (this.root.dataset.live === "1" && "WebSocket" in window) this.connect();
    else this.poll();
  }

  connect() {
    const generation = this.generation;
    const scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
    const query = `?replica=${this.replica}&offset=${this.offset}`;
    const socket = new WebSocket(`${scheme}//${window.location.host}${this.root.dataset.ws}${query}`);
    this.socket = socket;
    socket.addEventListener("open", () => {
      if (generation === this.generation) this.showState();
    });
    socket.addEventListener("message", (event) => {
      if (generation !== this.generation) return;
      let message;
      try { message = JSON.parse(event.data); } catch (e) { return; }
      if (message.type === "log") {
        this.socketFailures = 0;
        this.receive(message);
      }
    });
    socket.addEventListener("close", (event) => {
      if (generation !== this.generation || this.complete) return;
      this.socketFailures += 1;
      // Refused (4400/4401/4404) or failing: the API says why, and serves the log all the same.
      if (event.code >= 4400 || this.socketFailures >= SOCKET_ATTEMPTS) this.poll();
      else this.timer = window.setTimeout(() => this.connect(), 1000 * 2 ** this.socketFailures);
    });
  }

  async poll() {
    const generation = this.generation;
    let delay = POLL_MS;
    try {
      const url = `${this.root.dataset.api}?replica=${this.replica}&offset=${this.offset}`;
      const response = await window.fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const message = await response.json();
      if (generation !== this.generation) return;
      this.receive(message);
      if (message.complete) return;
      if (message.text.length > 100000) delay = 0; // more is waiting: read on at once
    } catch (error) {
      if (generation !== this.generation) return;
      this.root.dataset.state = "error";
      this.status.textContent = this.labels.labelError;
      delay = POLL_MS * 2;
    }
    this.timer = window.setTimeout(() => this.poll(), delay);
  }

  receive(message) {
    if (message.truncated_before > 0 && this.offset < message.truncated_before) this.truncatedNoted = true;
    this.offset = message.next_offset;
    if (message.text) {
      if (this.paused) this.pending += message.text;
      else this.append(message.text);
    }
    this.complete = Boolean(message.complete);
    this.showState();
  }

  append(text) {
    this.text.appendChild(document.createTextNode(text));
    if (this.text.textContent.length > MAX_SHOWN_CHARS) {
      this.text.textContent = this.text.textContent.slice(-MAX_SHOWN_CHARS / 2);
      this.truncatedNoted = true;
    }
    this.text.scrollTop = this.text.scrollHeight;
  }

  setPaused(paused) {
    this.paused = paused;
    this.toggle.setAttribute("aria-pressed", String(paused));
    this.toggle.textContent = paused ? this.labels.labelFollow : this.labels.labelPause;
    if (!paused && this.pending) {
      this.append(this.pending);
      this.pending = "";
    }
    this.showState();
  }

  showState() {
    const hasText = this.text.textContent.length > 0 || this.pending.length > 0;
    let sentence;
    if (this.complete) sentence = hasText ? this.labels.labelComplete : this.labels.labelEmpty;
    else if (this.paused) sentence = this.labels.labelPaused;
    else sentence = hasText ? this.labels.labelFollowing : this.labels.labelEmpty;
    if (this.truncatedNoted) sentence = `${this.labels.labelTruncated} ${sentence}`;
    this.status.textContent = sentence;
    this.root.dataset.state = this.complete ? "complete" : this.paused ? "paused" : "following";
  }
}

export function mountJobLogs(root) {
  for (const element of root.querySelectorAll("[data-job-log]")) {
    if (!element.jobLog) element.jobLog = new JobLog(element);
  }
}
