#!/usr/bin/env python3
"""synth_check.py - pure-Python sanity check of a synthetic model's activation scales.

Usage: tools/synth_check.py MODEL_DIR   (tiny preset only: single BF16/F32 model.safetensors)

Runs the NemotronH forward of reference/nemotron-architecture.md section 2 token by token
(recurrent Mamba2, causal NoPE attention, sigmoid-routed relu2 MoE, relu2 MLP) over 12 fixed
tokens and prints, per layer, the mixer-output and residual RMS plus one health number (dt range,
attention entropy, distinct expert sets), then logit std / entropy / argmax at three positions.
It exists to check that `cairn make-model` weights keep activations O(1) and the model
non-degenerate; it is slow, unoptimized, and NOT a validated golden reference.
"""
import json,struct,math,sys
D=sys.argv[1]
cfg=json.load(open(D+'/config.json'))
d=open(D+'/model.safetensors','rb').read()
n=struct.unpack('<Q',d[:8])[0]; h=json.loads(d[8:8+n]); base=8+n
def T(name):
    v=h[name]; a,b=v['data_offsets']; raw=d[base+a:base+b]
    if v['dtype']=='F32': x=list(struct.unpack('<%df'%(len(raw)//4),raw))
    else: x=list(struct.unpack('<%df'%(len(raw)//2), b''.join(b'\0\0'+raw[i:i+2] for i in range(0,len(raw),2))))
    sh=v['shape']
    if len(sh)>=2:
        cols=sh[-1]; return [x[i*cols:(i+1)*cols] for i in range(len(x)//cols)]
    return x
def mv(W,x): return [sum(a*b for a,b in zip(r,x)) for r in W]
def rms(x,w,eps=1e-5):
    s=1/math.sqrt(sum(v*v for v in x)/len(x)+eps); return [a*s*b for a,b in zip(x,w)]
silu=lambda v: v/(1+math.exp(-v))
H=cfg['hidden_size']; pat=cfg['hybrid_override_pattern']
toks=[1,300,301,302,50,60,70,80,90,100,110,120]
E=T('backbone.embeddings.weight')
hs=[E[t][:] for t in toks]
nh=cfg['mamba_num_heads']; hd=cfg['mamba_head_dim']; ng=cfg['n_groups']; N=cfg['ssm_state_size']; K=cfg['conv_kernel']
din=nh*hd
for L,c in enumerate(pat):
    p='backbone.layers.%d.'%L; m=p+'mixer.'
    xs=[rms(x,T(p+'norm.weight')) for x in hs]
    if c=='M':
        Wi=T(m+'in_proj.weight'); cw=T(m+'conv1d.weight'); cb=T(m+'conv1d.bias'); dtb=T(m+'dt_bias'); Al=T(m+'A_log'); Dd=T(m+'D'); nw=T(m+'norm.weight'); Wo=T(m+'out_proj.weight')
        zx=[mv(Wi,x) for x in xs]; cd=din+2*ng*N
        S=[[[0.0]*N for _ in range(hd)] for _ in range(nh)]
        outs=[]; dts=[]
        for t in range(len(xs)):
            z=zx[t][:din]; dtr=zx[t][din+cd:]
            xbc=[]
            for ch in range(cd):
                acc=cb[ch]
                for k in range(K):
                    tt=t-(K-1)+k
                    if tt>=0: acc+=cw[ch][k]*zx[tt][din+ch]
                xbc.append(silu(acc))
            xv=xbc[:din]; B=xbc[din:din+ng*N]; C=xbc[din+ng*N:]
            y=[0.0]*din
            for hh in range(nh):
                g=hh//(nh//ng); dt=math.log1p(math.exp(dtr[hh]+dtb[hh])); dts.append(dt); A=-math.exp(Al[hh]); dA=math.exp(dt*A)
                for pp in range(hd):
                    xi=xv[hh*hd+pp]; s=S[hh][pp]; acc=0
                    for nn in range(N):
                        s[nn]=s[nn]*dA+dt*xi*B[g*N+nn]; acc+=s[nn]*C[g*N+nn]
                    y[hh*hd+pp]=acc+Dd[hh]*xi
            y=[a*silu(b) for a,b in zip(y,z)]
            gs=din//ng; yn=[]
            for g in range(ng):
                seg=y[g*gs:(g+1)*gs]; yn+=rms(seg,nw[g*gs:(g+1)*gs])
            outs.append(mv(Wo,yn))
        info='dt range %.4f..%.4f'%(min(dts),max(dts))
    elif c=='*':
        q=[mv(T(m+'q_proj.weight'),x) for x in xs]; k=[mv(T(m+'k_proj.weight'),x) for x in xs]; v=[mv(T(m+'v_proj.weight'),x) for x in xs]
        nq=cfg['num_attention_heads']; nkv=cfg['num_key_value_heads']; D_=cfg['head_dim']; outs=[]; ents=[]
        for t in range(len(xs)):
            o=[]
            for qh in range(nq):
                kh=qh//(nq//nkv); qq=q[t][qh*D_:(qh+1)*D_]
                sc=[sum(a*b for a,b in zip(qq,k[s][kh*D_:(kh+1)*D_]))/math.sqrt(D_) for s in range(t+1)]
                mx=max(sc); e=[math.exp(s-mx) for s in sc]; z=sum(e); pr=[x/z for x in e]
                ents.append(-sum(p_*math.log(p_+1e-30) for p_ in pr))
                o+=[sum(pr[s]*v[s][kh*D_+j] for s in range(t+1)) for j in range(D_)]
            outs.append(mv(T(m+'o_proj.weight'),o))
        info='attn entropy mean %.3f'%(sum(ents)/len(ents))
    elif c=='E':
        G=T(m+'gate.weight'); bias=T(m+'gate.e_score_correction_bias'); ne=cfg['n_routed_experts']; k_=cfg['num_experts_per_tok']
        outs=[]; picks=[]
        for x in xs:
            s=[1/(1+math.exp(-l)) for l in mv(G,x)]
            idx=sorted(range(ne),key=lambda e:-(s[e]+bias[e]))[:k_]; picks.append(tuple(sorted(idx)))
            w=[s[e] for e in idx]; z=sum(w)+1e-20; w=[a/z*cfg['routed_scaling_factor'] for a in w]
            y=[0.0]*H
            for wi,e in zip(w,idx):
                u=[max(0,a)**2 for a in mv(T(m+'experts.%d.up_proj.weight'%e),x)]
                y=[a+wi*b for a,b in zip(y,mv(T(m+'experts.%d.down_proj.weight'%e),u))]
            u=[max(0,a)**2 for a in mv(T(m+'shared_experts.up_proj.weight'),x)]
            y=[a+b for a,b in zip(y,mv(T(m+'shared_experts.down_proj.weight'),u))]
            outs.append(y)
        info='distinct expert sets %d'%len(set(picks))
    else:
        outs=[mv(T(m+'down_proj.weight'),[max(0,a)**2 for a in mv(T(m+'up_proj.weight'),x)]) for x in xs]; info=''
    orms=sum(sum(a*a for a in o)/H for o in outs)/len(outs)
    hs=[[a+b for a,b in zip(x,o)] for x,o in zip(hs,outs)]
    hr=sum(sum(a*a for a in x)/H for x in hs)/len(hs)
    print(L,c,'mixer rms %.3f'%math.sqrt(orms),'resid rms %.3f'%math.sqrt(hr),info)
W=T('lm_head.weight'); nf=T('backbone.norm_f.weight')
for t in [0,5,11]:
    lg=mv(W,rms(hs[t],nf)); mx=max(lg); e=[math.exp(a-mx) for a in lg]; z=sum(e)
    ent=-sum(a/z*math.log(a/z) for a in e)
    print('tok',t,'logit std %.3f'%math.sqrt(sum(a*a for a in lg)/len(lg)),'entropy %.3f (uniform %.3f)'%(ent,math.log(len(lg))),'argmax',lg.index(mx))
