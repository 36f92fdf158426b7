// The customer's tracking page, and the reference client for app developers: it watches one
// order as any customer app does, MQTT over WebSocket at the viewer gateway with the tracking
// token as password, subscribed to track/<order> only. /track/<order>/status (same token)
// tells an ended order ("delivered") from a cut connection.
import L from 'leaflet';
import mqtt from 'mqtt';
import 'leaflet/dist/leaflet.css';
import './maps.css';
import { readConfig, takeToken, baseMap, refuse, ago } from './common.js';

const cfg = readConfig();
const token = takeToken();
const order = decodeURIComponent(window.location.pathname.split('/')[2] || '');
const topic = `track/${order}`;
const $ = (id) => document.getElementById(id);

// What the tests read (window.trackPage): every message as received, and the page's state.
const state = { received: [], connection: 'starting', delivered: false, refused: false, position: null };
window.trackPage = state;

function setConnection(s) {
  state.connection = s;
  $('conn').textContent = s;
  $('conn').className = s === 'live' ? 'fresh-text' : 'muted';
}

let client = null;
function end() {
  if (client) client.end(true);
  client = null;
}

function refused(title, detail) {
  state.refused = true;
  end();
  setConnection('closed');
  refuse(title, detail);
}

function delivered() {
  state.delivered = true;
  end();
  setConnection('closed');
  $('delivered').hidden = false;
  $('age').textContent = '';
}

// Whether the order still runs, by the same token: 401 is a refusal, running=false delivered.
async function status() {
  const r = await fetch(`/track/${encodeURIComponent(order)}/status`, {
    headers: { Authorization: `Bearer ${token}` }, cache: 'no-store',
  });
  if (r.status === 401) return 'refused';
  if (!r.ok) return 'unknown';
  return (await r.json()).running ? 'running' : 'ended';
}

async function recheck() {
  if (state.delivered || state.refused) return;
  const s = await status().catch(() => 'unknown');
  if (s === 'ended') delivered();
  else if (s === 'refused') refused('This tracking link has expired', 'Open the latest link from your order.');
}

if (!token) {
  refused('This tracking link is not valid', 'It carries no tracking token.');
} else {
  start();
}

async function start() {
  const first = await status().catch(() => 'unknown');
  if (first === 'refused') return refused('This tracking link has expired or is not valid', 'Open the latest link from your order.');
  const map = baseMap('map', cfg, { zoomControl: true });
  map.setView([20, 0], 2);
  if (first === 'ended') return delivered();

  let marker = null;
  let anim = null;
  // The way the courier came, from the points this page received (the last 200).
  const trace = L.polyline([], { color: '#2357d9', weight: 3, opacity: 0.35 }).addTo(map);
  let lastAt = null;
  // The marker glides from where it is to the new point, over about the time points arrive
  // apart (at most 2 s), so the courier seems to drive rather than jump.
  let gap = 1000;
  function moveTo(lat, lon) {
    const to = L.latLng(lat, lon);
    trace.addLatLng(to);
    if (trace.getLatLngs().length > 200) trace.setLatLngs(trace.getLatLngs().slice(-200));
    if (!marker) {
      marker = L.circleMarker(to, { radius: 9, color: '#fff', weight: 3, fillColor: '#2357d9', fillOpacity: 1 }).addTo(map);
      map.setView(to, 16, { animate: false });
      state.position = [lat, lon];
      return;
    }
    const from = marker.getLatLng();
    const t0 = performance.now();
    const span = Math.min(Math.max(gap, 250), 2000);
    if (anim) cancelAnimationFrame(anim);
    const step = (t) => {
      const k = Math.min((t - t0) / span, 1);
      const e = k < 0.5 ? 2 * k * k : 1 - Math.pow(-2 * k + 2, 2) / 2;
      const p = L.latLng(from.lat + (to.lat - from.lat) * e, from.lng + (to.lng - from.lng) * e);
      marker.setLatLng(p);
      state.position = [p.lat, p.lng];
      if (!map.getBounds().pad(-0.2).contains(p)) map.panTo(p, { animate: true });
      anim = k < 1 ? requestAnimationFrame(step) : null;
    };
    anim = requestAnimationFrame(step);
  }

  setInterval(() => {
    if (!state.delivered && lastAt) $('age').textContent = `updated ${ago((Date.now() - lastAt) / 1000)}`;
  }, 1000);

  setConnection('connecting');
  client = mqtt.connect(cfg.ws_url, {
    protocolVersion: 4,
    clientId: `track-${Math.random().toString(16).slice(2, 12)}`,
    username: 'customer',
    password: token,
    clean: true,
    keepalive: 30,
    reconnectPeriod: 2000,
    connectTimeout: 10_000,
  });
  client.on('connect', () => {
    setConnection('live');
    client.subscribe(topic, { qos: 0 }, (err) => { if (err) setConnection('refused subscription'); });
  });
  client.on('message', (t, payload) => {
    let p;
    try { p = JSON.parse(new TextDecoder().decode(payload)); } catch (e) { return; }
    state.received.push({ topic: t, lat: p.lat, lon: p.lon, ts: p.ts });
    // Only this order's topic is ever granted; anything else is not drawn.
    if (t !== topic || !isFinite(p.lat) || !isFinite(p.lon)) return;
    const now = Date.now();
    if (lastAt) gap = now - lastAt;
    lastAt = now;
    $('age').textContent = 'updated just now';
    $('waiting').hidden = true;
    moveTo(p.lat, p.lon);
  });
  client.on('reconnect', () => setConnection('reconnecting'));
  client.on('offline', () => { setConnection('offline'); recheck(); });
  client.on('close', () => { if (state.connection === 'live') setConnection('reconnecting'); recheck(); });
  client.on('error', () => recheck());
}
