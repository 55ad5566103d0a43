// Writes a LeRobot v3.0 dataset of any size for bench/lerobot_bench.sh, laid out as LeRobot's
// writer lays it out: per camera, many episodes concatenated in each mp4 (here encoded in one pass
// with a keyframe at every episode start, which is what concatenating separately encoded episodes
// gives); the frame rows in data/ parquet files; the episode table, tasks and stats in meta/.
//
//   node make_lerobot_bench.mjs OUT_DIR EPISODES FRAMES CAMERAS SIZE CODEC FPS EPISODES_PER_VIDEO
//                               EPISODES_PER_DATA_FILE
//
// CODEC: av1 (libsvtav1, GOP 2, LeRobot's default) or h264 (libx264, B-frames, GOP 30, a keyframe
// forced at each episode start). With av1, FRAMES must be even so that every episode starts on a
// keyframe of the GOP 2 cadence. State and action are 14-dim float32 (a two-arm robot).
import * as arrow from 'apache-arrow';
import * as pw from 'parquet-wasm/esm';
import { execFileSync } from 'node:child_process';
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';

const [out, episodesArg, framesArg, camerasArg, size, codec, fpsArg, perVideoArg, perDataArg] =
  process.argv.slice(2);
if (!perDataArg) {
  console.error('usage: node make_lerobot_bench.mjs OUT EPISODES FRAMES CAMERAS WxH av1|h264 FPS ' +
                'EPISODES_PER_VIDEO EPISODES_PER_DATA_FILE');
  process.exit(2);
}
const root = resolve(out);
const EPISODES = Number(episodesArg), FRAMES = Number(framesArg), CAMERAS = Number(camerasArg);
const FPS = Number(fpsArg), PER_VIDEO = Number(perVideoArg), PER_DATA = Number(perDataArg);
if (codec === 'av1' && FRAMES % 2) throw new Error('av1 (GOP 2) needs an even FRAMES');
const [W, H] = size.split('x').map(Number);
const require = createRequire(import.meta.url);
pw.initSync({ module: readFileSync(require.resolve('parquet-wasm/esm/parquet_wasm_bg.wasm')) });

const env = { ...process.env, SVT_LOG: '1' };
function ffmpeg(...args) {
  execFileSync('ffmpeg', ['-hide_banner', '-loglevel', 'error', '-nostdin', '-y', ...args],
    { env, stdio: ['ignore', 'ignore', 'inherit'] });
}
const pad3 = n => String(n).padStart(3, '0');
const i64 = values => arrow.vectorFromArray(values.map(BigInt), new arrow.Int64());
const f32list = () => new arrow.List(new arrow.Field('item', new arrow.Float32(), true));
function writeParquet(file, columns) {
  mkdirSync(dirname(file), { recursive: true });
  const table = new arrow.Table(columns);
  const wasmTable = pw.Table.fromIPCStream(arrow.tableToIPC(table, 'stream'));
  const props = new pw.WriterPropertiesBuilder().setCompression(pw.Compression.SNAPPY).build();
  writeFileSync(file, pw.writeParquet(wasmTable, props));
}

rmSync(root, { recursive: true, force: true });
const cameras = Array.from({ length: CAMERAS }, (_, c) => `observation.images.cam${c}`);
const videoFiles = Math.ceil(EPISODES / PER_VIDEO);
const dataFiles = Math.ceil(EPISODES / PER_DATA);
const started = Date.now();

// Videos: one encode per camera and file; episode e starts at frame (e % PER_VIDEO) * FRAMES.
cameras.forEach((key, c) => {
  for (let f = 0; f < videoFiles; ++f) {
    const eps = Math.min(PER_VIDEO, EPISODES - f * PER_VIDEO);
    const file = join(root, `videos/${key}/chunk-000/file-${pad3(f)}.mp4`);
    mkdirSync(dirname(file), { recursive: true });
    const src = `testsrc2=size=${size}:rate=${FPS},hue=h=${(c * 97 + f * 31) % 360}`;
    const args = codec === 'av1'
      ? ['-c:v', 'libsvtav1', '-g', '2', '-crf', '35', '-preset', '12']
      : ['-c:v', 'libx264', '-preset', 'veryfast', '-bf', '2', '-g', '30', '-sc_threshold', '0',
         '-force_key_frames', Array.from({ length: eps }, (_, k) => (k * FRAMES / FPS).toFixed(6)).join(',')];
    ffmpeg('-f', 'lavfi', '-i', src, '-frames:v', String(eps * FRAMES), ...args, '-pix_fmt', 'yuv420p',
      '-movflags', 'faststart', file);
    process.stderr.write(`make_lerobot_bench: ${key} file ${f + 1}/${videoFiles} ` +
      `(${eps * FRAMES} frames, ${((Date.now() - started) / 1000).toFixed(1)} s)\n`);
  }
});

// Rows: state and action 14-dim, one row per frame.
const DIM = 14;
for (let f = 0; f < dataFiles; ++f) {
  const first = f * PER_DATA, eps = Math.min(PER_DATA, EPISODES - first);
  const n = eps * FRAMES;
  const ep = [], frame = [], index = [], ts = [], task = [], state = [], action = [];
  for (let r = 0; r < n; ++r) {
    const e = first + Math.floor(r / FRAMES), k = r % FRAMES, g = e * FRAMES + k;
    ep.push(e); frame.push(k); index.push(g); ts.push(Math.fround(k / FPS)); task.push(e % 2);
    state.push(Array.from({ length: DIM }, (_, j) => Math.fround(Math.sin(g * 0.01 + j))));
    action.push(Array.from({ length: DIM }, (_, j) => Math.fround(Math.cos(g * 0.01 + j))));
  }
  writeParquet(join(root, `data/chunk-000/file-${pad3(f)}.parquet`), {
    'observation.state': arrow.vectorFromArray(state, f32list()),
    action: arrow.vectorFromArray(action, f32list()),
    timestamp: arrow.vectorFromArray(ts, new arrow.Float32()),
    frame_index: i64(frame), episode_index: i64(ep), index: i64(index), task_index: i64(task),
  });
}

// The episode table (one meta file), tasks, stats, info.
const durationS = FRAMES / FPS;
const e = Array.from({ length: EPISODES }, (_, i) => i);
const cols = {
  episode_index: i64(e),
  tasks: arrow.vectorFromArray(e.map(i => [i % 2 ? 'fold the towel' : 'pick up the cube']),
    new arrow.List(new arrow.Field('item', new arrow.Utf8(), true))),
  length: i64(e.map(() => FRAMES)),
  'data/chunk_index': i64(e.map(() => 0)),
  'data/file_index': i64(e.map(i => Math.floor(i / PER_DATA))),
  dataset_from_index: i64(e.map(i => i * FRAMES)),
  dataset_to_index: i64(e.map(i => (i + 1) * FRAMES)),
};
for (const key of cameras) {
  cols[`videos/${key}/chunk_index`] = i64(e.map(() => 0));
  cols[`videos/${key}/file_index`] = i64(e.map(i => Math.floor(i / PER_VIDEO)));
  cols[`videos/${key}/from_timestamp`] = arrow.vectorFromArray(e.map(i => (i % PER_VIDEO) * durationS), new arrow.Float64());
  cols[`videos/${key}/to_timestamp`] = arrow.vectorFromArray(e.map(i => (i % PER_VIDEO + 1) * durationS), new arrow.Float64());
}
cols['meta/episodes/chunk_index'] = i64(e.map(() => 0));
cols['meta/episodes/file_index'] = i64(e.map(() => 0));
writeParquet(join(root, 'meta/episodes/chunk-000/file-000.parquet'), cols);
writeParquet(join(root, 'meta/tasks.parquet'), {
  task_index: i64([0, 1]),
  __index_level_0__: arrow.vectorFromArray(['pick up the cube', 'fold the towel'], new arrow.Utf8()),
});
const stat = () => ({ min: Array(DIM).fill(-1), max: Array(DIM).fill(1), mean: Array(DIM).fill(0),
  std: Array(DIM).fill(0.7071), count: [EPISODES * FRAMES] });
writeFileSync(join(root, 'meta/stats.json'),
  JSON.stringify({ 'observation.state': stat(), action: stat() }, null, 2));
const features = {
  'observation.state': { dtype: 'float32', shape: [DIM], names: null },
  action: { dtype: 'float32', shape: [DIM], names: null },
  timestamp: { dtype: 'float32', shape: [1], names: null },
  frame_index: { dtype: 'int64', shape: [1], names: null },
  episode_index: { dtype: 'int64', shape: [1], names: null },
  index: { dtype: 'int64', shape: [1], names: null },
  task_index: { dtype: 'int64', shape: [1], names: null },
};
for (const key of cameras) {
  features[key] = { dtype: 'video', shape: [H, W, 3], names: ['height', 'width', 'channels'],
    info: { 'video.height': H, 'video.width': W, 'video.codec': codec, 'video.pix_fmt': 'yuv420p',
      'video.is_depth_map': false, 'video.fps': FPS, 'video.channels': 3, has_audio: false } };
}
writeFileSync(join(root, 'meta/info.json'), JSON.stringify({
  codebase_version: 'v3.0', robot_type: 'bench_arm', total_episodes: EPISODES,
  total_frames: EPISODES * FRAMES, total_tasks: 2, chunks_size: 1000, data_files_size_in_mb: 100,
  video_files_size_in_mb: 500, fps: FPS, splits: { train: `0:${EPISODES}` },
  data_path: 'data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet',
  video_path: 'videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4',
  features }, null, 4));
process.stderr.write(`make_lerobot_bench: ${root}: ${EPISODES} episodes x ${FRAMES} frames, ` +
  `${CAMERAS} ${codec} cameras ${size} at ${FPS} fps in ${((Date.now() - started) / 1000).toFixed(1)} s\n`);
