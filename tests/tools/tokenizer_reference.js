#!/usr/bin/env node
// Writes what the real Hugging Face tokenizers library (Rust, through the
// @anush008/tokenizers napi binding) gives for a tokenizer.json, as a reference for
// Tandem's tokenizer tests: the ids of a deterministic corpus of varied strings (no
// special tokens added) and their decoding, and the text of random id sequences decoded
// with and without skip_special_tokens.
//
//   node tests/tools/tokenizer_reference.js --tokenizer DIR/tokenizer.json --out FILE.json
//       [--node-modules DIR] [--seed N]
//
// The npm packages live in tools/node/node_modules (scripts/install-deps.sh installs
// them). Uses nothing but Node's standard library and that package.
'use strict';

const fs = require('fs');
const path = require('path');

function fail(message) {
  process.stderr.write(`tokenizer_reference: ${message}\n`);
  process.exit(1);
}

function parseArgs(argv) {
  const args = {
    tokenizer: null,
    out: null,
    nodeModules: path.resolve(__dirname, '..', '..', 'tools', 'node', 'node_modules'),
    seed: 20240611,
  };
  for (let i = 0; i < argv.length; ++i) {
    const value = argv[i + 1];
    switch (argv[i]) {
      case '--tokenizer': args.tokenizer = value; ++i; break;
      case '--out': args.out = value; ++i; break;
      case '--node-modules': args.nodeModules = value; ++i; break;
      case '--seed': args.seed = Number(value); ++i; break;
      default: fail(`unknown argument '${argv[i]}'`);
    }
  }
  if (!args.tokenizer || !args.out) fail('usage: --tokenizer PATH/tokenizer.json --out FILE');
  return args;
}

// ---- deterministic randomness (mulberry32) ----

function makeRng(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const int = (lo, hi) => lo + Math.floor(next() * (hi - lo + 1));  // inclusive
  const pick = (list) => list[int(0, list.length - 1)];
  const chars = (lo, hi, n) => {
    let s = '';
    for (let i = 0; i < n; ++i) s += String.fromCodePoint(int(lo, hi));
    return s;
  };
  return { next, int, pick, chars };
}

// ---- corpus ----

const ENGLISH = (
  'the quick brown fox jumps over lazy dog and then it was not what we expected because ' +
  'people often think that language models read text as words but they read tokens which ' +
  'are pieces of words numbers punctuation and whitespace serving systems batch requests ' +
  'schedule prefill decode steps cache keys values across layers attention heads experts ' +
  'routing tensor parallel pipeline throughput latency memory bandwidth kernel fusion ' +
  "don't can't won't it's I'm you're we've they'll she'd HTML JSON URL GPU CPU NVIDIA " +
  'Hello World Internationalization antidisestablishmentarianism pneumonoultramicroscopic'
).split(' ');
const PUNCT = ['.', ',', '!', '?', ';', ':', '...', ' -- ', '—', '–', '"', "'", '(', ')', '[', ']',
  '{', '}', '<', '>', '/', '\\', '@', '#', '$', '%', '^', '&', '*', '_', '=', '+', '~', '`', '|',
  '«', '»', '“', '”', '‘', '’', '¿', '¡', '§', '¶', '•', '†', '€', '£', '¥', '©', '®', '™', '°'];
const CJK = '的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯专石若兵弟谁校读志飞观争究包组造落视济喜离虽坏兴';
const KANA_KANJI = 'あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんがぎぐげござじずぜぞだぢづでどばびぶべぼぱぴぷぺぽっゃゅょアイウエオカキクケコサシスセソタチツテトナニヌネノハヒフヘホマミムメモヤユヨラリルレロワヲンガギグゲゴザジズゼゾダヂヅデドバビブベボパピプペポッャュョー日本語東京大阪漢字文化学校先生時間今日明日電話会社仕事食事新聞天気';
const KOREAN_WORDS = ['안녕하세요', '감사합니다', '한국어', '서울', '컴퓨터', '모델', '토큰', '사랑해요', '대한민국', '학교'];
const ARABIC = ['مرحبا بالعالم', 'اللغة العربية', 'شكرا جزيلا', 'الذكاء الاصطناعي', 'كِتَابٌ جَمِيلٌ', 'السَّلَامُ عَلَيْكُمْ'];
const HEBREW = ['שלום עולם', 'תודה רבה', 'עברית', 'בְּרֵאשִׁית בָּרָא', 'מחשב'];
const HINDI = ['नमस्ते दुनिया', 'हिन्दी भाषा', 'धन्यवाद', 'कृत्रिम बुद्धिमत्ता', 'क्षत्रिय', 'श्री'];
const THAI = ['สวัสดีครับ', 'ภาษาไทย', 'ขอบคุณมาก', 'ปัญญาประดิษฐ์', 'กรุงเทพมหานคร'];
const RUSSIAN = ['Привет, мир!', 'Москва', 'языковая модель', 'Ёжик в тумане', 'спасибо большое'];
const GREEK = ['Γειά σου Κόσμε', 'ελληνικά', 'Ωμέγα', 'φιλοσοφία', 'ΑΒΓΔΕ αβγδε'];
const EMOJI = ['😀', '😂', '🥲', '🤖', '🚀', '🔥', '👍', '👍🏽', '👋🏿', '🧑🏻‍💻', '👨‍👩‍👧‍👦', '👩‍❤️‍💋‍👨',
  '🏳️‍🌈', '🏴‍☠️', '🇺🇸', '🇯🇵', '🇫🇷', '🇨🇳', '🇩🇪', '1️⃣', '#️⃣', '❤️', '☺️', '✨', '🎉', '🫠', '🏃‍♀️', '🤷🏼‍♂️',
  '🩷', '🫎', '🪼', '🫨', '🫩', '🫆', '🪾'];  // the last ones: Unicode 15.0 and 16.0
const SPACES = [' ', '  ', '    ', '\t', '\n', '\r\n', '\n\n', '\u00a0', '\u3000', '\u2009', '\u2002',
  '\u200b', '\u180e', '\u0085', '\u2028', '\u1680', '\u202f', '\u205f', '\u000b', '\u000c', '\r'];
const DIGITS = ['0123456789', '٠١٢٣٤٥٦٧٨٩', '०१२३४५६७८९', '０１２３４５６７８９', '²³¹', '½¾', 'ⅫⅣ', '①②③'];

function englishSentence(rng) {
  const n = rng.int(1, 25);
  const words = [];
  for (let i = 0; i < n; ++i) {
    let w = rng.pick(ENGLISH);
    if (rng.next() < 0.1) w = w[0].toUpperCase() + w.slice(1);
    if (rng.next() < 0.05) w = w.toUpperCase();
    words.push(w);
    if (rng.next() < 0.12) words.push(rng.pick(PUNCT));
  }
  let s = words.join(rng.next() < 0.9 ? ' ' : '  ');
  if (rng.next() < 0.7) s = s[0].toUpperCase() + s.slice(1) + rng.pick(['.', '!', '?', '', '...']);
  return s;
}

function identifier(rng) {
  const parts = ['get', 'set', 'value', 'count', 'index', 'buffer', 'size', 'tmp', 'x', 'kv', 'cache',
    'token', 'id', 'batch', 'layer', 'head', 'dim', 'num', 'max', 'min'];
  const style = rng.int(0, 2);
  const n = rng.int(1, 3);
  const ps = [];
  for (let i = 0; i < n; ++i) ps.push(rng.pick(parts));
  if (style === 0) return ps.join('_');
  if (style === 1) return ps[0] + ps.slice(1).map((p) => p[0].toUpperCase() + p.slice(1)).join('');
  return ps.join('_').toUpperCase() + rng.int(0, 99);
}

function codeSnippet(rng) {
  const a = identifier(rng);
  const b = identifier(rng);
  const n = rng.int(0, 100000);
  const indent = rng.pick(['', '  ', '    ', '\t', '        ']);
  const templates = [
    () => `#include <vector>\n\nint ${a}(const std::vector<int>& ${b}) {\n${indent}return ${b}.size() * ${n};\n}\n`,
    () => `for (size_t i = 0; i < ${a}.size(); ++i) {\n${indent}${b}[i] += ${a}[i] >> ${rng.int(1, 31)};\n}`,
    () => `template <typename T>\nstruct ${a} {\n  T ${b}{};\n  static constexpr int kMax = 0x${n.toString(16)};\n};`,
    () => `def ${a}(${b}, *args, **kwargs):\n${indent || '    '}"""Docstring."""\n${indent || '    '}return [x ** 2 for x in ${b} if x % ${rng.int(2, 9)} == 0]\n`,
    () => `import numpy as np\n${a} = np.zeros((${rng.int(1, 64)}, ${rng.int(1, 64)}), dtype=np.float32)\nprint(f"{${a}.shape=}")`,
    () => `class ${a[0].toUpperCase() + a.slice(1)}(object):\n    def __init__(self):\n        self.${b} = None  # TODO: fix ${n}\n`,
    () => JSON.stringify({ [a]: n, [b]: [1.5, -2e-3, null, true, 'x\ty'], nested: { k: a } }, null, rng.pick([0, 2, 4])),
    () => `{"model": "${a}", "messages": [{"role": "user", "content": "${englishSentence(rng).replace(/"/g, '\\"')}"}], "max_tokens": ${n}}`,
    () => `$ ./build/bin/${a} --${b}=${n} 2>&1 | grep -E '^(ERROR|WARN)' > /tmp/${b}.log && echo $?`,
    () => `SELECT ${a}, COUNT(*) FROM ${b} WHERE ${a} >= ${n} GROUP BY 1 ORDER BY 2 DESC;`,
    () => `<div class="${a}"><span id='${b}'>&lt;${n}&gt;</span></div>`,
    () => `// ${englishSentence(rng)}\n/* ${englishSentence(rng)} */\n${a} = ${b} != nullptr ? *${b} : ${n};`,
  ];
  return rng.pick(templates)();
}

function fromChars(rng, alphabet, lo, hi) {
  const list = Array.from(alphabet);
  let s = '';
  const n = rng.int(lo, hi);
  for (let i = 0; i < n; ++i) s += rng.pick(list);
  return s;
}

function combining(rng) {
  let s = '';
  const n = rng.int(1, 12);
  for (let i = 0; i < n; ++i) {
    s += rng.pick(['a', 'e', 'o', 'u', 'n', 'A', 'Z', ' ', 'i', 'x', '1', '.']);
    const marks = rng.int(0, 4);
    s += rng.chars(0x300, 0x36f, marks);
  }
  return s;
}

function whitespaceRun(rng) {
  let s = '';
  const n = rng.int(1, 40);
  for (let i = 0; i < n; ++i) s += rng.pick(SPACES);
  if (rng.next() < 0.6) s = rng.pick(ENGLISH) + s;
  if (rng.next() < 0.6) s += rng.pick(ENGLISH);
  if (rng.next() < 0.3) s += rng.pick(SPACES);
  return s;
}

function digitRun(rng) {
  const kind = rng.int(0, 4);
  if (kind === 0) return rng.chars(0x30, 0x39, rng.int(1, 60));
  if (kind === 1) {
    let s = '';
    const n = rng.int(1, 30);
    for (let i = 0; i < n; ++i) {
      s += rng.next() < 0.5 ? rng.chars(0x30, 0x39, rng.int(1, 5)) : rng.chars(0x61, 0x7a, rng.int(1, 4));
      if (rng.next() < 0.2) s += rng.pick(['.', ',', '-', '_', ' ', 'e', 'x', ':']);
    }
    return s;
  }
  if (kind === 2) return `${rng.int(0, 1e9)}.${rng.int(0, 99999)} ${rng.pick(['USD', '%', 'km', 'GB/s', '°C'])}`;
  if (kind === 3) return fromChars(rng, rng.pick(DIGITS), 1, 20);
  return `v${rng.int(0, 20)}.${rng.int(0, 99)}.${rng.int(0, 999)}-rc${rng.int(1, 9)} (${rng.int(1900, 2100)}-${rng.int(1, 12)}-${rng.int(1, 28)})`;
}

function punctuationRun(rng) {
  let s = '';
  const n = rng.int(1, 30);
  for (let i = 0; i < n; ++i) s += rng.pick(PUNCT);
  if (rng.next() < 0.5) s = rng.pick(ENGLISH) + s + rng.pick(ENGLISH);
  if (rng.next() < 0.3) s += rng.pick(['\n', '\r\n', '\n\n']);
  return s;
}

function emojiString(rng) {
  let s = '';
  const n = rng.int(1, 10);
  for (let i = 0; i < n; ++i) {
    s += rng.pick(EMOJI);
    if (rng.next() < 0.3) s += rng.pick([' ', '', '!', rng.pick(ENGLISH)]);
  }
  return s;
}

function scriptString(rng) {
  const kind = rng.int(0, 9);
  switch (kind) {
    case 0: return fromChars(rng, CJK, 1, 40) + rng.pick(['', '，', '。', '！', '？', '、', '：']);
    case 1: return fromChars(rng, KANA_KANJI, 1, 40) + rng.pick(['', '。', '、', '「', '」']);
    case 2: return Array.from({ length: rng.int(1, 6) }, () => rng.pick(KOREAN_WORDS)).join(' ') + rng.chars(0xac00, 0xd7a3, rng.int(0, 5));
    case 3: return rng.pick(ARABIC) + ' ' + rng.chars(0x627, 0x64a, rng.int(0, 8));
    case 4: return rng.pick(HEBREW) + ' ' + rng.chars(0x5d0, 0x5ea, rng.int(0, 8));
    case 5: return rng.pick(HINDI) + ' ' + rng.pick(HINDI);
    case 6: return rng.pick(THAI) + rng.chars(0xe01, 0xe2e, rng.int(0, 8));
    case 7: return rng.pick(RUSSIAN) + ' ' + rng.chars(0x430, 0x44f, rng.int(0, 10));
    case 8: return rng.pick(GREEK) + ' ' + rng.chars(0x3b1, 0x3c9, rng.int(0, 10));
    default: return `${englishSentence(rng)} ${fromChars(rng, CJK, 1, 8)} ${rng.pick(RUSSIAN)} ${rng.pick(EMOJI)}`;
  }
}

function withSpecialTokens(rng, addedTokens) {
  const n = rng.int(1, 6);
  let s = '';
  for (let i = 0; i < n; ++i) {
    const token = rng.pick(addedTokens);
    const variant = rng.int(0, 9);
    let piece = token;
    if (variant === 0) piece = token.slice(0, Math.max(1, token.length - 2));  // truncated
    if (variant === 1) piece = token + token;  // adjacent
    if (variant === 2) piece = ` ${token} `;
    if (variant === 3) piece = `\n${token}\n`;
    if (variant === 4) piece = token.replace('｜', '|');
    s += piece;
    if (rng.next() < 0.7) s += rng.pick([englishSentence(rng), codeSnippet(rng), scriptString(rng), ' ', '']);
  }
  return s;
}

function longWord(rng) {
  const kind = rng.int(0, 5);
  const n = rng.int(200, 3000);
  if (kind === 0) return rng.pick(['a', 'x', 'é', '中', '😀', '-', '0', ' ']).repeat(n);
  if (kind === 1) return rng.chars(0x61, 0x7a, n);
  if (kind === 2) return rng.pick(ENGLISH).repeat(rng.int(20, 200));
  if (kind === 3) return fromChars(rng, CJK, n, n);
  if (kind === 4) return 'http://example.com/' + rng.chars(0x61, 0x7a, n) + '?q=' + rng.chars(0x30, 0x39, 50);
  return rng.chars(0x41, 0x5a, n);
}

function randomCodePoints(rng) {
  // Well-established ranges only (the reference and PCRE2 may know different Unicode
  // versions; code points assigned long ago classify the same in both).
  const ranges = [[0x20, 0x7e], [0xa0, 0x24f], [0x370, 0x3ff], [0x400, 0x4ff], [0x590, 0x5ff],
    [0x600, 0x6ff], [0x900, 0x97f], [0xe00, 0xe7f], [0x1100, 0x11ff], [0x2000, 0x206f],
    [0x2100, 0x22ff], [0x2500, 0x25ff], [0x3000, 0x30ff], [0x4e00, 0x9fa5], [0xac00, 0xd7a3],
    [0xff00, 0xffef], [0x1f300, 0x1f5ff], [0x1f600, 0x1f64f], [0x0, 0x1f]];
  let s = '';
  const n = rng.int(1, 40);
  for (let i = 0; i < n; ++i) {
    const [lo, hi] = rng.pick(ranges);
    s += rng.chars(lo, hi, 1);
  }
  return s;
}

function edgeStrings(addedTokens) {
  const fixed = ['', ' ', '  ', '\n', '\t', '\r\n', 'a', ' a', 'a ', ' a ', 'Hello', ' Hello', 'Hello ',
    '  Hello  world  ', "I'm", "don't", "'s", "'", "''", 'x\u0301', '\u0301', '\u00a0x', 'x\u00a0',
    '\u3000', '\u3000\u3000abc', 'abc\u3000', '\u2009\u2009', '\u180e', 'a\u180eb', ' \u180e ',
    '\u0085', 'a\u0085b', '\u2028', '123', '1234', '12345678901234567890', ' 1', '1 ', 'a1b2c3',
    '3.14159', '1,000,000', '١٢٣', '²', 'Ⅻ', '!!!', '...', '?!', '\n\n\n', ' \n ', '\r', '\r\r\n',
    'a\r\nb', '\t\t\tx', 'x   ', '   x', 'x\n   ', '中文', ' 中文', '中文 ', 'カタカナ', 'ひらがな',
    '漢字かな交じり文', '한국어', '🇺🇸', '👨‍👩‍👧‍👦', '🏳️‍🌈', '👍🏽', 'é', 'e\u0301', 'ﬁ', 'Å', 'Ω',
    '<|EOT|>', '<s>', '</s>', '<unk>', '<pad>', '<|endoftext|>', '<|im_start|>', 'a'.repeat(10000),
    'ab'.repeat(5000), ' '.repeat(1000), '\n'.repeat(500), '0'.repeat(1000), '中'.repeat(2000),
    'Ġ', 'Ċ', 'ĠĠ', 'âĢĻ', '\u0100\u0101', '\uffff', '\ufffd', '\ufeffBOM', '\u200d', '\u200c',
    '\u0000', 'a\u0000b', '\u007f', '\u001b[31mred\u001b[0m',
    // Code points Unicode 15.0-16.0 assigned (PCRE2 10.42 knows Unicode 14.0 only).
    '🩷', ' 🩷', 'I ❤️ 🩷 🫎!', ' 🫩', '\u{2EBF0}\u{2EBF1}', ' \u{2EBF0}', ' \u{31350}', ' \u{13460}',
    ' \u{16100}\u{16101}', 'x\u{1E5D0}', ' \u{10D40}\u{10D41}', '\u{11F50}\u{11F51}\u{11F52}\u{11F53}',
    ' \u{1CC00}', '\u{0897}a'];
  for (const token of addedTokens.slice(0, 40)) {
    fixed.push(token, ` ${token}`, `${token} `, `x${token}y`, `${token}${token}`, `\n${token}\n`);
  }
  return fixed;
}

function buildCorpus(rng, addedTokens) {
  const corpus = edgeStrings(addedTokens);
  const generators = [
    [englishSentence, 300], [codeSnippet, 250], [scriptString, 350], [emojiString, 100],
    [combining, 80], [whitespaceRun, 150], [digitRun, 150], [punctuationRun, 100],
    [(r) => withSpecialTokens(r, addedTokens), 200], [longWord, 30], [randomCodePoints, 150],
  ];
  for (const [generate, count] of generators) {
    for (let i = 0; i < count; ++i) corpus.push(generate(rng));
  }
  // Mixtures of everything, with spaces at either end now and then.
  for (let i = 0; i < 250; ++i) {
    const parts = [];
    const n = rng.int(2, 6);
    for (let k = 0; k < n; ++k) {
      const [generate] = rng.pick(generators);
      parts.push(generate === longWord ? 'word' : generate(rng));
    }
    let s = parts.join(rng.pick(['', ' ', '\n', '  ', '\t']));
    if (rng.next() < 0.2) s = ' ' + s;
    if (rng.next() < 0.2) s += ' ';
    corpus.push(s);
  }
  return corpus;
}

// ---- decode cases ----

function buildDecodeCases(rng, tokenizer, vocabSize, addedIds, encoded) {
  const byteIds = [];
  for (let b = 0; b < 256; ++b) {
    // GPT-2's bytes_to_unicode, to find each byte's token.
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    let cp = b;
    if (!printable) {
      let n = 0;
      for (let c = 0; c < b; ++c) {
        if (!((c >= 0x21 && c <= 0x7e) || (c >= 0xa1 && c <= 0xac) || c >= 0xae)) ++n;
      }
      cp = 256 + n;
    }
    const id = tokenizer.tokenToId(String.fromCodePoint(cp));
    byteIds.push(id === null || id === undefined ? -1 : id);
  }
  const byte = (b) => byteIds[b];
  const invalidSequences = [[0x80], [0xbf], [0xc0, 0x80], [0xc1, 0xbf], [0xc2], [0xe2, 0x82],
    [0xe2, 0x82, 0x41], [0xe0, 0x80, 0x80], [0xe0, 0x9f, 0xbf], [0xed, 0xa0, 0x80],
    [0xed, 0xbf, 0xbf], [0xf0, 0x8f, 0xbf, 0xbf], [0xf0, 0x9f, 0x98], [0xf4, 0x90, 0x80, 0x80],
    [0xf5, 0x80], [0xfe], [0xff], [0xf0, 0x9f, 0x98, 0x80], [0xe4, 0xb8], [0xf1, 0x80, 0x80],
    [0xc3, 0xa9], [0xe4, 0xb8, 0xad]];
  const cases = [];
  const randomId = () => {
    const r = rng.next();
    if (r < 0.1) return rng.pick(addedIds);
    if (r < 0.35) return byte(rng.int(0, 255));
    if (r < 0.37) return vocabSize + rng.int(0, 10);  // out of range: skipped
    return rng.int(0, vocabSize - 1);
  };
  for (let i = 0; i < 300; ++i) {
    const n = rng.int(0, 30);
    cases.push(Array.from({ length: n }, randomId));
  }
  for (let i = 0; i < 200; ++i) {
    const ids = [];
    const n = rng.int(1, 8);
    for (let k = 0; k < n; ++k) {
      if (rng.next() < 0.6) ids.push(...rng.pick(invalidSequences).map(byte));
      else ids.push(randomId());
    }
    cases.push(ids);
  }
  for (let i = 0; i < 200; ++i) {
    const ids = rng.pick(encoded).slice(0, 200);
    const withSpecials = [];
    for (const id of ids) {
      if (rng.next() < 0.1) withSpecials.push(rng.pick(addedIds));
      withSpecials.push(id);
    }
    cases.push(withSpecials);
  }
  return cases.map((ids) => ids.filter((id) => id >= 0));
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const bindingDir = path.join(args.nodeModules, '@anush008', 'tokenizers');
  if (!fs.existsSync(bindingDir)) {
    fail(`${bindingDir} is missing: run scripts/install-deps.sh (it installs the npm packages into tools/node)`);
  }
  if (!fs.existsSync(args.tokenizer)) {
    fail(`${args.tokenizer} is missing` +
         (args.tokenizer.includes('node_modules') ? ': run scripts/install-deps.sh' : ''));
  }
  let Tokenizer;
  try {
    ({ Tokenizer } = require(bindingDir));
  } catch (e) {
    fail(`cannot load ${bindingDir} (${e.message}): run scripts/install-deps.sh`);
  }
  const tokenizer = Tokenizer.fromFile(args.tokenizer);
  const json = JSON.parse(fs.readFileSync(args.tokenizer, 'utf8'));
  const added = (json.added_tokens || []).map((t) => t.content);
  const addedIds = (json.added_tokens || []).map((t) => t.id);
  // Favour the named added tokens over DeepSeek's 800 numbered place holders.
  const named = added.filter((t) => !t.includes('place▁holder'));
  const someHolders = added.filter((t) => t.includes('place▁holder')).slice(0, 5);
  const addedForText = named.concat(someHolders);
  const vocabSize = tokenizer.getVocabSize(true);

  const rng = makeRng(args.seed);
  const corpus = buildCorpus(rng, addedForText);
  const encode = [];
  for (const text of corpus) {
    const encoding = await tokenizer.encode(text, null, { addSpecialTokens: false });
    const entry = { text, ids: encoding.getIds() };
    // Decoding gives the text back unless pre-tokenization changed it (added prefix
    // spaces, removed delimiters); then the reference records what it gives.
    const decoded = await tokenizer.decode(entry.ids, false);
    if (decoded !== text) entry.decoded = decoded;
    encode.push(entry);
  }
  const decodeCases = buildDecodeCases(rng, tokenizer, vocabSize, addedIds,
                                       encode.map((e) => e.ids).filter((ids) => ids.length > 0));
  const decode = [];
  for (const ids of decodeCases) {
    decode.push({
      ids,
      text: await tokenizer.decode(ids, false),
      text_skip_special: await tokenizer.decode(ids, true),
    });
  }
  const out = {
    tokenizer_json: path.resolve(args.tokenizer),
    tokenizer_dir: path.dirname(path.resolve(args.tokenizer)),
    vocab_size: vocabSize,
    seed: args.seed,
    encode,
    decode,
  };
  fs.mkdirSync(path.dirname(path.resolve(args.out)), { recursive: true });
  fs.writeFileSync(args.out, JSON.stringify(out));
  process.stdout.write(`tokenizer_reference: ${encode.length} strings, ${decode.length} id sequences -> ${args.out}\n`);
}

main().catch((e) => fail(e.stack || String(e)));
